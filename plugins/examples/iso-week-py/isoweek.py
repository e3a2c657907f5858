"""ISO-8601 week arithmetic on plain integers (no datetime objects, so no range loss).

Times are microseconds since the Unix epoch, UTC (the WIT type `timestamp-micros`, an s64).
Everything here uses Python's floor division, so negative times (before 1970) land in the
right week: t = -1 is 1969-12-31T23:59:59.999999Z, in the week that starts Monday 1969-12-29.

This module has no dependency on the component bindings, so `check_math.py` can import it
with a plain `python3`.
"""

MICROS_PER_DAY = 86_400_000_000
DAYS_PER_WEEK = 7

# Supported ISO week-numbering years.
MIN_ISO_YEAR = 1
MAX_ISO_YEAR = 9999


class OutOfRange(ValueError):
    """The time is outside ISO week-years 0001..9999."""


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of the proleptic Gregorian date y-m-d (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400                                   # [0, 399]
    mp = (m + 9) % 12                                     # March = 0
    doy = (153 * mp + 2) // 5 + d - 1                     # [0, 365]
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy         # [0, 146096]
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    """(year, month, day) of the day `z` days after 1970-01-01 (proleptic Gregorian)."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097                                # [0, 146096]
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365  # [0, 399]
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)       # [0, 365]
    mp = (5 * doy + 2) // 153                             # [0, 11], March = 0
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (1 if m <= 2 else 0)           # the year starts in March above
    return y, m, d


def iso_week_of_day(days: int) -> tuple[int, int, int]:
    """(iso_year, iso_week, monday) for the day `days` since the epoch; monday is in days too."""
    # 1970-01-01 was a Thursday: (days + 3) % 7 is 0 on Mondays.
    monday = days - (days + 3) % 7
    thursday = monday + 3
    # The ISO week-year is the calendar year of the week's Thursday.
    iso_year = civil_from_days(thursday)[0]
    jan1 = days_from_civil(iso_year, 1, 1)
    week = (thursday - jan1) // 7 + 1
    return iso_year, week, monday


# First microsecond of ISO year 0001 (Monday 0001-01-01) and first microsecond after ISO year
# 9999 (Monday 10000-01-03). Computed, not hard-coded, to keep them honest.
def _iso_year_start(y: int) -> int:
    jan4 = days_from_civil(y, 1, 4)         # 4 January is always in week 1
    return jan4 - (jan4 + 3) % 7


MIN_TIME = _iso_year_start(MIN_ISO_YEAR) * MICROS_PER_DAY            # inclusive
END_TIME = _iso_year_start(MAX_ISO_YEAR + 1) * MICROS_PER_DAY        # exclusive


def week_bucket(t: int) -> tuple[str, int, int]:
    """(key, start, end) of the ISO week containing `t` (microseconds since the epoch).

    Raises OutOfRange outside ISO week-years 0001..9999.
    """
    if not isinstance(t, int) or isinstance(t, bool):
        raise OutOfRange(f"time {t!r} is not an integer number of microseconds")
    if t < MIN_TIME or t >= END_TIME:
        raise OutOfRange(
            f"time {t} µs since the epoch is outside the supported range: ISO week-years "
            f"{MIN_ISO_YEAR:04d}..{MAX_ISO_YEAR:04d}, i.e. {MIN_TIME} <= t < {END_TIME} "
            f"(0001-01-01T00:00:00Z up to 10000-01-03T00:00:00Z)"
        )
    days = t // MICROS_PER_DAY          # floor division: correct for negative t
    iso_year, week, monday = iso_week_of_day(days)
    start = monday * MICROS_PER_DAY
    end = start + DAYS_PER_WEEK * MICROS_PER_DAY
    return f"week:{iso_year:04d}-W{week:02d}", start, end
