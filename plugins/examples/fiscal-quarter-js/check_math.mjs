#!/usr/bin/env node
// Plain-Node check of app.js (no WebAssembly involved): the fiscal-quarter math against a
// small independent reference built on JS Date, plus config parsing, the s64/BigInt handling
// and the error convention (exports must throw strings). app.js imports the host's log
// interface, so a module hook stands in for `frostline:plugin/log@0.1.0`.
//
// Run: node plugins/examples/fiscal-quarter-js/check_math.mjs [N_RANDOM_PER_MONTH] [SEED]
// Prints 'N passed, N failed' and exits non-zero on any failure.

import { register } from 'node:module';

const LOG_STUB =
  'export function log(level, message) { (globalThis.__frostlineLogs ??= []).push([level, message]); }';
const HOOKS = `
export async function resolve(specifier, context, next) {
  if (specifier === 'frostline:plugin/log@0.1.0') {
    return { url: 'data:text/javascript,' + encodeURIComponent(${JSON.stringify(LOG_STUB)}), shortCircuit: true };
  }
  return next(specifier, context);
}`;
register('data:text/javascript,' + encodeURIComponent(HOOKS));

const app = await import(new URL('./app.js', import.meta.url));

const N = Number(process.argv[2] ?? 3000);
let seed = BigInt(process.argv[3] ?? 20240229);

let passed = 0;
let failed = 0;
function check(cond, what) {
  if (cond) passed++;
  else {
    failed++;
    if (failed <= 20) console.log('FAIL:', what());
  }
}

// splitmix64, so runs are reproducible.
function nextU64() {
  seed = BigInt.asUintN(64, seed + 0x9e3779b97f4a7c15n);
  let z = seed;
  z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
  z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
  return z ^ (z >> 31n);
}
const randBelow = (n) => nextU64() % n; // n: BigInt, bias negligible here

// ---- the independent reference: JS Date, no day-count formulas ----
const US = 1000n; // microseconds per millisecond
function utcMs(year, month0, day = 1) {
  const d = new Date(0);
  d.setUTCFullYear(year, month0, day); // unlike Date.UTC, no 19xx mapping of years 0..99
  return d.getTime();
}
function floorDiv(a, b) {
  const q = a / b;
  return a % b < 0n ? q - 1n : q;
}
const MIN_T = BigInt(utcMs(1, 0)) * US; // 0001-01-01T00:00:00Z
const END_T = BigInt(utcMs(10000, 0)) * US; // 10000-01-01T00:00:00Z
function reference(t, fm) {
  if (t < MIN_T || t >= END_T) return { error: true };
  const ms = floorDiv(t, US);
  const date = new Date(Number(ms));
  const y = date.getUTCFullYear();
  const m = date.getUTCMonth() + 1;
  // The fiscal year is named by the calendar year in which it ends.
  const fyStartYear = fm === 1 || m >= fm ? y : y - 1;
  const fiscalYear = fm === 1 ? y : fyStartYear + 1;
  if (fiscalYear < 1 || fiscalYear > 9999) return { error: true };
  // The 5 quarter boundaries of that fiscal year (Date rolls month overflow into the year).
  const bounds = [0, 1, 2, 3, 4].map((k) => BigInt(utcMs(fyStartYear, fm - 1 + 3 * k)) * US);
  for (let k = 0; k < 4; k++) {
    if (bounds[k] <= t && t < bounds[k + 1]) {
      return {
        key: `fquarter:${String(fiscalYear).padStart(4, '0')}-Q${k + 1}`,
        start: bounds[k],
        end: bounds[k + 1],
      };
    }
  }
  throw new Error(`reference found no quarter for ${t}`);
}

function same(got, want) {
  return got.key === want.key && got.start === want.start && got.end === want.end &&
    typeof got.start === 'bigint' && typeof got.end === 'bigint';
}

function show(x) {
  return JSON.stringify(x, (_, v) => (typeof v === 'bigint' ? `${v}n` : v));
}

function callBucketFor(arg) {
  try {
    return { ok: app.strategy.bucketFor(arg) };
  } catch (e) {
    return { err: e };
  }
}

function checkTime(t, fm) {
  const want = reference(t, fm);
  for (const arg of [t, BigInt.asUintN(64, t)]) { // negative s64 may arrive unsigned
    const got = callBucketFor(arg);
    if (want.error) {
      check('err' in got && typeof got.err === 'string' && got.err.includes(String(t)) &&
        got.err.includes('0001..9999'),
      () => `fm=${fm} t=${t} (passed as ${arg}): want an error string naming the time and range, got ${show(got)}`);
    } else {
      check('ok' in got && same(got.ok, want) && got.ok.start <= t && t < got.ok.end,
        () => `fm=${fm} t=${t} (passed as ${arg}): got ${show(got)}, want ${show(want)}`);
    }
  }
}

const DAY = 86_400_000_000n;
for (let fm = 1; fm <= 12; fm++) {
  globalThis.__frostlineLogs = [];
  const cfg = fm === 1 ? '' : JSON.stringify({ first_month: fm });
  let initErr = null;
  try {
    app.init(cfg);
  } catch (e) {
    initErr = e;
  }
  check(initErr === null, () => `init(${cfg}) threw ${initErr}`);
  check(globalThis.__frostlineLogs.length === 1 && globalThis.__frostlineLogs[0][0] === 'info',
    () => `init logs once at info: ${show(globalThis.__frostlineLogs)}`);

  // Random times across (and a little beyond) the supported range.
  const lo = MIN_T - 400n * DAY;
  const span = END_T + 400n * DAY - lo;
  for (let i = 0; i < N; i++) checkTime(lo + randBelow(span), fm);
  // Random times anywhere in s64.
  for (let i = 0; i < 200; i++) checkTime(BigInt.asIntN(64, nextU64()), fm);

  // Every month boundary +-1 us in the first and last 3 years, around 1970 and 2000.
  const years = [0, 1, 2, 3, 1968, 1969, 1970, 1971, 1999, 2000, 2024, 2025, 9997, 9998, 9999, 10000];
  for (const y of years) {
    for (let mo = 0; mo < 12; mo++) {
      const b = BigInt(utcMs(y, mo)) * US;
      for (const d of [-1n, 0n, 1n, DAY / 2n]) checkTime(b + d, fm);
    }
  }
  for (const t of [-1n, 0n, 1n, MIN_T - 1n, MIN_T, END_T - 1n, END_T,
    -(2n ** 63n), 2n ** 63n - 1n, -(10n ** 17n), 10n ** 18n]) checkTime(t, fm);

  // buckets-for: one answer per time, in order; one bad time fails the whole call.
  const times = [-1n, 0n, 1_700_000_000_000_000n, BigInt.asUintN(64, -5n * DAY)];
  let batch;
  try {
    batch = app.strategy.bucketsFor(times);
  } catch (e) {
    batch = e;
  }
  check(Array.isArray(batch) && batch.length === times.length &&
    batch.every((b, i) => same(b, reference(BigInt.asIntN(64, times[i]), fm))),
  () => `fm=${fm} bucketsFor: ${show(batch)}`);
  // A BigInt64Array is what componentize-js hands over for list<s64>.
  let typed;
  try {
    typed = app.strategy.bucketsFor(new BigInt64Array([-1n, 0n]));
  } catch (e) {
    typed = e;
  }
  check(Array.isArray(typed) && typed.length === 2 && same(typed[0], reference(-1n, fm)),
    () => `fm=${fm} bucketsFor(BigInt64Array): ${show(typed)}`);
  let batchErr = null;
  try {
    app.strategy.bucketsFor([0n, END_T, 0n]);
  } catch (e) {
    batchErr = e;
  }
  check(typeof batchErr === 'string' && batchErr.startsWith('event-times[1]: '),
    () => `fm=${fm} bucketsFor with a bad time: ${show(batchErr)}`);
}

// Named cases from the brief.
app.init('{"first_month": 4}');
const at = (y, m0, d = 1) => BigInt(utcMs(y, m0, d)) * US;
const q = (t) => app.strategy.bucketFor(t);
check(q(at(2024, 3)).key === 'fquarter:2025-Q1', () => `2024-04-01 fm=4: ${show(q(at(2024, 3)))}`);
check(same(q(at(2024, 5, 30) + DAY - 1n), { key: 'fquarter:2025-Q1', start: at(2024, 3), end: at(2024, 6) }),
  () => 'end of June 2024 fm=4 is 2025-Q1 = Apr..Jun 2024');
check(q(at(2025, 2, 31)).key === 'fquarter:2025-Q4', () => '2025-03-31 fm=4 is 2025-Q4');
check(q(-1n).key === 'fquarter:1970-Q3', () => `t=-1 fm=4: ${show(q(-1n))}`);
check(q(at(9999, 2, 31)).key === 'fquarter:9999-Q4', () => 'March 9999 fm=4 is 9999-Q4');
let e9999 = null;
try {
  q(at(9999, 3));
} catch (e) {
  e9999 = e;
}
check(typeof e9999 === 'string' && e9999.includes('fiscal year 10000'), () => `April 9999 fm=4: ${show(e9999)}`);
app.init('');
check(same(q(-1n), { key: 'fquarter:1969-Q4', start: at(1969, 9), end: 0n }), () => `t=-1 fm=1: ${show(q(-1n))}`);
check(q(at(1, 0)).key === 'fquarter:0001-Q1', () => 'first supported time');
check(q(END_T - 1n).key === 'fquarter:9999-Q4', () => 'last supported time');
app.init('{}');
check(q(at(2024, 6)).key === 'fquarter:2024-Q3', () => '{} means first_month 1');

// Config: accepted and refused strings. A refused config leaves the previous one in place.
for (const [cfg, fm] of [['', 1], ['{}', 1], ['  ', 1], ['{"first_month":12}', 12], [' {"first_month": 7} ', 7]]) {
  let got;
  try {
    got = app.parseConfig(cfg);
  } catch (e) {
    got = e;
  }
  check(got === fm, () => `parseConfig(${JSON.stringify(cfg)}) = ${show(got)}, want ${fm}`);
}
app.init('{"first_month": 10}');
for (const [cfg, needle] of [
  ['x', 'not valid JSON'], ['[]', 'JSON object'], ['null', 'JSON object'], ['4', 'JSON object'],
  ['{"first_month":0}', 'first_month'], ['{"first_month":13}', 'first_month'],
  ['{"first_month":4.5}', 'first_month'], ['{"first_month":"4"}', 'first_month'],
  ['{"first_month":null}', 'first_month'], ['{"first_month":4,"tz":"UTC"}', '"tz"'],
  ['{"firstMonth":4}', '"firstMonth"'],
]) {
  let err = null;
  try {
    app.init(cfg);
  } catch (e) {
    err = e;
  }
  check(typeof err === 'string' && err.includes(needle),
    () => `init(${JSON.stringify(cfg)}) should be refused naming ${needle}: ${show(err)}`);
}
check(q(at(2024, 9)).key === 'fquarter:2025-Q1', () => 'a refused config keeps first_month=10');

console.log(`fiscal-quarter-js check_math.mjs (${N} random times per first_month):`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
