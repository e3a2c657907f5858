// frostline example plugin: fiscal quarters in UTC, as a `bucket-strategy` component.
//
// Built with componentize-js 0.23.0 (SpiderMonkey); see ../build.sh:
//
//   npx componentize-js app.js --wit ../../../wit --world-name bucket-strategy \
//     -d stdio random clocks http fetch-event -o fiscal-quarter-js.wasm
//
// Config (JSON): {"first_month": 1..12}; the empty string or {} means 1 (calendar quarters).
// The fiscal year is named by the calendar year in which it ENDS: with first_month = 4,
// April 2024 .. March 2025 is fiscal 2025, and its Q1 is April..June 2024.
// Keys look like `fquarter:2025-Q1`. Bounds are microseconds since the Unix epoch (s64).
// Supported: times in calendar years 0001..9999 whose fiscal year is also 0001..9999;
// other times answer an error.
//
// componentize-js conventions used here (checked against 0.23.0):
// - WIT s64 arrives as a BigInt, and a negative one may arrive as its unsigned two's
//   complement (e.g. -1 as 18446744073709551615n): normalise with BigInt.asIntN(64, x).
// - s64 fields returned to the host must be BigInts.
// - For `result<T, string>`: returning a value is `ok`; throwing a string is `err(string)`.
//   Throwing an Error object is NOT turned into err: it escapes and traps the instance
//   (the generated binding rethrows `instanceof Error`), so throw strings only.
// - The WIT enum `level` is passed as its case name, a string ('info').

import { log } from 'frostline:plugin/log@0.1.0';

const MICROS_PER_DAY = 86_400_000_000n;
const MIN_YEAR = 1;
const MAX_YEAR = 9999;
const CONFIG_FIELDS = ['first_month'];

let firstMonth = 1;

// Days since 1970-01-01 of the proleptic Gregorian date y-m-d (H. Hinnant's algorithm).
// All intermediate values stay far below 2^53 for years 0..10000, so Numbers are exact.
export function daysFromCivil(y, m, d) {
  y -= m <= 2 ? 1 : 0;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const mp = (m + 9) % 12;
  const doy = Math.floor((153 * mp + 2) / 5) + d - 1;
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
  return era * 146097 + doe - 719468;
}

// [year, month 1..12, day] of the day `z` days after 1970-01-01.
export function civilFromDays(z) {
  z += 719468;
  const era = Math.floor(z / 146097);
  const doe = z - era * 146097;
  const yoe = Math.floor((doe - Math.floor(doe / 1460) + Math.floor(doe / 36524) - Math.floor(doe / 146096)) / 365);
  const doy = doe - (365 * yoe + Math.floor(yoe / 4) - Math.floor(yoe / 100));
  const mp = Math.floor((5 * doy + 2) / 153);
  const d = doy - Math.floor((153 * mp + 2) / 5) + 1;
  const m = mp < 10 ? mp + 3 : mp - 9;
  return [yoe + era * 400 + (m <= 2 ? 1 : 0), m, d];
}

const MIN_DAY = daysFromCivil(MIN_YEAR, 1, 1); // 0001-01-01
const END_DAY = daysFromCivil(MAX_YEAR + 1, 1, 1); // 10000-01-01, exclusive

function pad(n, width) {
  return String(n).padStart(width, '0');
}

function outOfRange(t, why) {
  return `fiscal-quarter: time ${t} µs since the epoch is outside the supported range ` +
    `(calendar and fiscal years ${pad(MIN_YEAR, 4)}..${MAX_YEAR}, first_month=${firstMonth})${why}`;
}

// The fiscal quarter containing `t` (microseconds since the epoch, BigInt), for a fiscal year
// starting on the first day of month `fm` (1..12). Returns {key, start, end} with BigInt
// bounds, or throws a string.
export function fiscalQuarter(t, fm) {
  // Floor division: BigInt `/` truncates toward zero.
  let days = t / MICROS_PER_DAY;
  if (t % MICROS_PER_DAY < 0n) days -= 1n;
  if (days < BigInt(MIN_DAY) || days >= BigInt(END_DAY)) throw outOfRange(t, '');
  const [y, m] = civilFromDays(Number(days));
  const intoYear = (m - fm + 12) % 12; // months since the fiscal year began
  const fiscalYear = fm === 1 || m < fm ? y : y + 1;
  if (fiscalYear < MIN_YEAR || fiscalYear > MAX_YEAR) {
    throw outOfRange(t, `: it is in fiscal year ${fiscalYear}`);
  }
  const quarter = Math.floor(intoYear / 3) + 1;
  // Absolute month index (year * 12 + month0) of the quarter's first month.
  const first = y * 12 + (m - 1) - (intoYear % 3);
  const next = first + 3;
  const monthStart = (idx) =>
    BigInt(daysFromCivil(Math.floor(idx / 12), (idx % 12) + 1, 1)) * MICROS_PER_DAY;
  return {
    key: `fquarter:${pad(fiscalYear, 4)}-Q${quarter}`,
    start: monthStart(first),
    end: monthStart(next),
  };
}

// Parses the config string; returns first_month or throws a string naming the problem.
export function parseConfig(config) {
  if (typeof config !== 'string') throw `fiscal-quarter: config must be a string`;
  if (config.trim() === '') return 1;
  let value;
  try {
    value = JSON.parse(config);
  } catch (e) {
    throw `fiscal-quarter: config is not valid JSON (${e && e.message ? e.message : e}): ${config.slice(0, 200)}`;
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw `fiscal-quarter: config must be a JSON object like {"first_month": 4}, got ${JSON.stringify(value)}`;
  }
  const unknown = Object.keys(value).filter((k) => !CONFIG_FIELDS.includes(k));
  if (unknown.length > 0) {
    throw `fiscal-quarter: unknown config field(s) ${unknown.map((k) => JSON.stringify(k)).join(', ')}; ` +
      `the only field is "first_month"`;
  }
  if (!('first_month' in value)) return 1;
  const fm = value.first_month;
  if (typeof fm !== 'number' || !Number.isInteger(fm) || fm < 1 || fm > 12) {
    throw `fiscal-quarter: "first_month" must be an integer from 1 to 12, got ${JSON.stringify(fm)}`;
  }
  return fm;
}

function toS64(x) {
  // s64 arguments are BigInts, negative ones possibly unsigned; accept a Number too.
  return BigInt.asIntN(64, typeof x === 'bigint' ? x : BigInt(x));
}

// componentize-js turns a thrown string into `err(string)`, but a thrown Error object
// escapes and traps the instance. So every export throws only strings.
function asErr(e) {
  return typeof e === 'string' ? e : `fiscal-quarter: internal error: ${e && e.message ? e.message : e}`;
}

// WIT: init: func(config: string) -> result<_, string>
export function init(config) {
  try {
    firstMonth = parseConfig(config);
  } catch (e) {
    throw asErr(e);
  }
  log('info', `fiscal-quarter strategy initialised (first_month=${firstMonth})`);
}

// WIT: export strategy
export const strategy = {
  // bucket-for: func(event-time: timestamp-micros) -> result<bucket-descriptor, string>
  bucketFor(eventTime) {
    try {
      return fiscalQuarter(toS64(eventTime), firstMonth);
    } catch (e) {
      throw asErr(e);
    }
  },
  // buckets-for: func(event-times: list<timestamp-micros>) -> result<list<bucket-descriptor>, string>
  bucketsFor(eventTimes) {
    const out = new Array(eventTimes.length);
    for (let i = 0; i < eventTimes.length; i++) {
      try {
        out[i] = fiscalQuarter(toS64(eventTimes[i]), firstMonth);
      } catch (e) {
        // One bad time fails the whole batch; say which one.
        throw `event-times[${i}]: ${asErr(e)}`;
      }
    }
    return out;
  },
};
