#!/usr/bin/env python3
"""Plain-Python check of the ISO-week math in isoweek.py (no WebAssembly involved).

Compares `isoweek.week_bucket` against `datetime.date.isocalendar()` for thousands of random
days in 0001..9999 plus the boundaries, and checks the out-of-range errors.

Run: python3 plugins/examples/iso-week-py/check_math.py [N_RANDOM_DAYS] [SEED]
Prints 'N passed, N failed' and exits non-zero on any failure.
"""

import datetime
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import isoweek  # noqa: E402
from isoweek import MICROS_PER_DAY, OutOfRange, week_bucket  # noqa: E402

EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
WEEK = 7 * MICROS_PER_DAY
S64_MIN, S64_MAX = -(2**63), 2**63 - 1

passed = 0
failed = 0


def check(cond: bool, what: str) -> None:
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        if failed <= 20:
            print("FAIL:", what)


def expected_for_day(days: int):
    """Reference answer from datetime for the day `days` after the epoch."""
    d = datetime.date.fromordinal(days + EPOCH_ORDINAL)
    iso = d.isocalendar()
    monday = d - datetime.timedelta(days=iso.weekday - 1)
    start = (monday.toordinal() - EPOCH_ORDINAL) * MICROS_PER_DAY
    return f"week:{iso.year:04d}-W{iso.week:02d}", start, start + WEEK


def check_day(days: int, rng: random.Random) -> None:
    exp = expected_for_day(days)
    # First and last microsecond of the day, and one in between.
    for t in (days * MICROS_PER_DAY,
              days * MICROS_PER_DAY + rng.randrange(MICROS_PER_DAY),
              (days + 1) * MICROS_PER_DAY - 1):
        got = week_bucket(t)
        check(got == exp, f"t={t}: got {got}, want {exp}")
        check(got[1] <= t < got[2], f"t={t}: not inside {got}")


def check_error(t: int) -> None:
    try:
        got = week_bucket(t)
    except OutOfRange as e:
        msg = str(e)
        check(str(t) in msg and "0001..9999" in msg, f"t={t}: message lacks time/range: {msg}")
    else:
        check(False, f"t={t}: expected an out-of-range error, got {got}")


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 20240229
    rng = random.Random(seed)

    first_day = datetime.date(1, 1, 1).toordinal() - EPOCH_ORDINAL        # -719162
    last_day = datetime.date(9999, 12, 31).toordinal() - EPOCH_ORDINAL     # 2932896

    # The integer calendar helpers against datetime, on their own.
    for days in [first_day, last_day, 0, -1, 59, 60, -719162 + 59] + [
            rng.randint(first_day, last_day) for _ in range(2000)]:
        d = datetime.date.fromordinal(days + EPOCH_ORDINAL)
        check(isoweek.civil_from_days(days) == (d.year, d.month, d.day), f"civil_from_days({days})")
        check(isoweek.days_from_civil(d.year, d.month, d.day) == days, f"days_from_civil({d})")

    # Random days across the whole range.
    for _ in range(n):
        check_day(rng.randint(first_day, last_day), rng)

    # Every day of the first and last 3 weeks of the range, of the weeks around the epoch,
    # and of every 1 Jan +/- 7 days for a spread of years (year boundaries, 53-week years).
    boundary_days = set(range(first_day, first_day + 21)) | set(range(last_day - 21, last_day + 1))
    boundary_days |= set(range(-21, 21))
    for y in list(range(1, 40)) + list(range(1895, 2105)) + list(range(9960, 10000)):
        jan1 = datetime.date(y, 1, 1).toordinal() - EPOCH_ORDINAL
        boundary_days |= set(range(jan1 - 7, jan1 + 8))
    for days in sorted(boundary_days):
        if first_day <= days <= last_day:
            check_day(days, rng)

    # Named cases from the brief.
    def key(t):
        return week_bucket(t)[0]

    check(week_bucket(-1) == ("week:1970-W01", -3 * MICROS_PER_DAY, 4 * MICROS_PER_DAY),
          f"t=-1 -> {week_bucket(-1)} (want the week of Monday 1969-12-29)")
    check(week_bucket(0)[0] == "week:1970-W01", "t=0")
    d = lambda y, m, dd: (datetime.date(y, m, dd).toordinal() - EPOCH_ORDINAL) * MICROS_PER_DAY
    check(key(d(2020, 12, 31)) == "week:2020-W53", "2020-12-31 is in 2020-W53")
    check(key(d(2021, 1, 3) + MICROS_PER_DAY - 1) == "week:2020-W53", "2021-01-03 is in 2020-W53")
    check(key(d(2021, 1, 4)) == "week:2021-W01", "2021-01-04 starts 2021-W01")
    check(key(d(2008, 12, 29)) == "week:2009-W01", "2008-12-29 is in 2009-W01")
    check(key(d(2015, 12, 31)) == "week:2015-W53", "2015-12-31 is in 2015-W53")
    check(key(d(2026, 12, 31)) == "week:2026-W53", "2026-12-31 is in 2026-W53")
    check(key(d(1, 1, 1)) == "week:0001-W01", "0001-01-01 is in 0001-W01")

    # 53-week years: exactly the years with 53 ISO weeks per datetime.
    for y in range(1, 10000):
        dec28 = datetime.date(y, 12, 28)   # always in the year's last week
        want = dec28.isocalendar().week
        got = key(d(y, 12, 28))
        check(got == f"week:{y:04d}-W{want:02d}", f"last week of {y}: {got} want W{want}")

    # Range edges: ISO year 0001 starts Monday 0001-01-01; ISO year 9999 ends Sunday
    # 10000-01-02 (datetime cannot show that day, so it is stated here).
    min_t = d(1, 1, 1)
    end_t = d(9999, 12, 27) + 7 * MICROS_PER_DAY      # Monday 10000-01-03
    check(isoweek.MIN_TIME == min_t, "MIN_TIME")
    check(isoweek.END_TIME == end_t, "END_TIME")
    check(week_bucket(end_t - 1) == ("week:9999-W52", d(9999, 12, 27), end_t),
          f"last supported microsecond -> {week_bucket(end_t - 1)}")
    check(week_bucket(min_t) == ("week:0001-W01", min_t, min_t + WEEK), "first supported microsecond")
    for t in (min_t - 1, end_t, end_t + 1, S64_MIN, S64_MAX, -(10**17), 10**18):
        check_error(t)

    # Consecutive weeks tile the range without gaps or overlaps.
    t = min_t
    prev = None
    for _ in range(3000):
        k, s, e = week_bucket(t)
        check(s == t and e == s + WEEK, f"tiling at {t}")
        if prev is not None:
            check(prev != k, f"duplicate key {k}")
        prev = k
        t = e

    print(f"iso-week-py check_math.py (seed {seed}, {n} random days):")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
