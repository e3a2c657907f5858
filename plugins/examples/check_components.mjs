#!/usr/bin/env node
// End-to-end check of the BUILT example components, without the frostline host: each .wasm
// is transpiled to JS + core wasm with jco (installed by build.sh as a dependency of
// componentize-js) and called from Node through the real component ABI (lifting/lowering of
// s64, strings, records, lists and result<T, string>). A stub provides the host's
// `frostline:plugin/log@0.1.0`; the Python component's WASI imports come from jco's
// preview2-shim. Answers are compared with small Date-based references.
//
// Run after build.sh:  node plugins/examples/check_components.mjs OUT_DIR [N_RANDOM]
// Prints 'N passed, N failed' and exits non-zero on any failure.

import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

// componentize-py's core modules use extended constant expressions, which V8 in Node < 22
// only accepts behind a flag: re-run this script with it.
const FLAG = '--experimental-wasm-extended-const';
const nodeMajor = Number(process.versions.node.split('.')[0]);
if (nodeMajor < 22 && !process.execArgv.includes(FLAG)) {
  const r = spawnSync(process.execPath, [FLAG, ...process.execArgv, fileURLToPath(import.meta.url),
    ...process.argv.slice(2)], { stdio: 'inherit' });
  process.exit(r.status ?? 1);
}

const HERE = dirname(fileURLToPath(import.meta.url));
const JS_DIR = join(HERE, 'fiscal-quarter-js');
const JCO = join(JS_DIR, 'node_modules/@bytecodealliance/jco/dist/jco.js');
if (process.argv.length < 3) {
  console.error('usage: node check_components.mjs OUT_DIR [N_RANDOM]');
  process.exit(2);
}
const OUT_DIR = resolve(process.argv[2]);
const N = Number(process.argv[3] ?? 2000);
if (!existsSync(JCO)) {
  console.error(`jco not found at ${JCO}: run build.sh first`);
  process.exit(2);
}

// Transpiled output goes under node_modules so that its `@bytecodealliance/preview2-shim`
// imports resolve to the installed package.
const WORK = join(JS_DIR, 'node_modules/.cache/frostline-check');
rmSync(WORK, { recursive: true, force: true });
mkdirSync(WORK, { recursive: true });
writeFileSync(join(WORK, 'log-stub.js'),
  'export function log(level, message) { (globalThis.__frostlineLogs ??= []).push([level, message]); }\n');

async function load(name) {
  const wasm = join(OUT_DIR, `${name}.wasm`);
  const out = join(WORK, name);
  execFileSync(process.execPath, [JCO, 'transpile', wasm, '-o', out, '--name', name, '-q',
    '--no-typescript', '--map', 'frostline:plugin/log@0.1.0=../log-stub.js'], { stdio: 'inherit' });
  return import(pathToFileURL(join(out, `${name}.js`)).href);
}

let passed = 0;
let failed = 0;
function check(cond, what) {
  if (cond) passed++;
  else {
    failed++;
    if (failed <= 30) console.log('FAIL:', what());
  }
}
const show = (x) => JSON.stringify(x, (_, v) => (typeof v === 'bigint' ? `${v}n` : v));

// A component call: {ok} or {err: payload}. jco throws a ComponentError whose `payload` is
// the err string; anything else (a trap) is reported as {trap}.
function call(fn, ...args) {
  try {
    return { ok: fn(...args) };
  } catch (e) {
    if (e && Object.prototype.hasOwnProperty.call(e, 'payload')) return { err: e.payload };
    return { trap: String(e) };
  }
}

// ---- references (JS Date; no day-count formulas) ----
const US = 1000n;
const DAY_MS = 86_400_000;
function utcMs(year, month0, day = 1) {
  const d = new Date(0);
  d.setUTCFullYear(year, month0, day);
  return d.getTime();
}
const floorDiv = (a, b) => (a % b < 0n ? a / b - 1n : a / b);
const T0001 = BigInt(utcMs(1, 0)) * US;
const T10000 = BigInt(utcMs(10000, 0)) * US;
const pad4 = (n) => String(n).padStart(4, '0');

function isoWeekRef(t) {
  if (t < T0001 - 7n * 86_400_000_000n || t > T10000 + 7n * 86_400_000_000n) return { error: true };
  const ms = Number(floorDiv(t, US));
  const day = ms - (((ms % DAY_MS) + DAY_MS) % DAY_MS);
  const monday = day - ((new Date(day).getUTCDay() + 6) % 7) * DAY_MS;
  const isoYear = new Date(monday + 3 * DAY_MS).getUTCFullYear(); // the year of its Thursday
  if (isoYear < 1 || isoYear > 9999) return { error: true };
  const jan4 = utcMs(isoYear, 0, 4);
  const week1 = jan4 - ((new Date(jan4).getUTCDay() + 6) % 7) * DAY_MS;
  const week = (monday - week1) / (7 * DAY_MS) + 1;
  return {
    key: `week:${pad4(isoYear)}-W${String(week).padStart(2, '0')}`,
    start: BigInt(monday) * US,
    end: BigInt(monday + 7 * DAY_MS) * US,
  };
}

function fiscalRef(t, fm) {
  if (t < T0001 || t >= T10000) return { error: true };
  const d = new Date(Number(floorDiv(t, US)));
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth() + 1;
  const fyStartYear = fm === 1 || m >= fm ? y : y - 1;
  const fiscalYear = fm === 1 ? y : fyStartYear + 1;
  if (fiscalYear < 1 || fiscalYear > 9999) return { error: true };
  const b = [0, 1, 2, 3, 4].map((k) => BigInt(utcMs(fyStartYear, fm - 1 + 3 * k)) * US);
  const k = [0, 1, 2, 3].find((i) => b[i] <= t && t < b[i + 1]);
  return { key: `fquarter:${pad4(fiscalYear)}-Q${k + 1}`, start: b[k], end: b[k + 1] };
}

let seed = 0x5eedn;
function nextU64() {
  seed = BigInt.asUintN(64, seed + 0x9e3779b97f4a7c15n);
  let z = seed;
  z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
  z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
  return z ^ (z >> 31n);
}

function sampleTimes(n) {
  const lo = T0001 - 400n * 86_400_000_000n;
  const span = T10000 + 400n * 86_400_000_000n - lo;
  const ts = [];
  for (let i = 0; i < n; i++) ts.push(lo + (nextU64() % span));
  for (let i = 0; i < 50; i++) ts.push(BigInt.asIntN(64, nextU64()));
  for (const y of [1, 1969, 1970, 2020, 2021, 9999]) {
    for (let mo = 0; mo < 12; mo++) {
      const b = BigInt(utcMs(y, mo)) * US;
      ts.push(b - 1n, b, b + 1n);
    }
  }
  ts.push(-1n, 0n, 1n, T0001 - 1n, T0001, T10000 - 1n, T10000, T10000 + 2n * 86_400_000_000n,
    -(2n ** 63n), 2n ** 63n - 1n);
  return ts;
}

function checkStrategy(label, strategy, ref, times) {
  for (const t of times) {
    const want = ref(t);
    const got = call(strategy.bucketFor, t);
    if (want.error) {
      check(typeof got.err === 'string' && got.err.includes(String(t)) && got.err.includes('0001..9999'),
        () => `${label} bucketFor(${t}): want err naming time and range, got ${show(got)}`);
    } else {
      check(got.ok && got.ok.key === want.key && got.ok.start === want.start && got.ok.end === want.end &&
        got.ok.start <= t && t < got.ok.end,
      () => `${label} bucketFor(${t}): got ${show(got)}, want ${show(want)}`);
    }
  }
  // Batch: the good times in one call, in order.
  const good = times.filter((t) => !ref(t).error);
  const batch = call(strategy.bucketsFor, good);
  check(Array.isArray(batch.ok) && batch.ok.length === good.length &&
    batch.ok.every((b, i) => b.key === ref(good[i]).key && b.start === ref(good[i]).start),
  () => `${label} bucketsFor(${good.length} times): ${show(batch).slice(0, 300)}`);
  check(Array.isArray(call(strategy.bucketsFor, []).ok), () => `${label} bucketsFor([])`);
  const bad = call(strategy.bucketsFor, [0n, -1n, -(2n ** 63n), 0n]);
  check(typeof bad.err === 'string' && bad.err.startsWith('event-times[2]: '),
    () => `${label} bucketsFor with a bad time: ${show(bad)}`);
}

function checkInit(label, mod, good, bad) {
  for (const cfg of good) {
    globalThis.__frostlineLogs = [];
    const r = call(mod.init, cfg);
    check('ok' in r, () => `${label} init(${JSON.stringify(cfg)}): ${show(r)}`);
    check(globalThis.__frostlineLogs.length === 1 && globalThis.__frostlineLogs[0][0] === 'info',
      () => `${label} init logs once at info: ${show(globalThis.__frostlineLogs)}`);
  }
  for (const [cfg, needle] of bad) {
    const r = call(mod.init, cfg);
    check(typeof r.err === 'string' && r.err.includes(needle),
      () => `${label} init(${JSON.stringify(cfg)}) should be err naming ${needle}: ${show(r)}`);
  }
}

const logs = [];
for (const name of ['iso-week-py', 'fiscal-quarter-js']) {
  const t0 = performance.now();
  const mod = await load(name);
  const loadMs = performance.now() - t0;
  check(typeof mod.init === 'function' && typeof mod.strategy?.bucketFor === 'function' &&
    typeof mod['frostline:plugin/strategy@0.1.0']?.bucketsFor === 'function',
  () => `${name}: exports ${Object.keys(mod)}`);
  const t1 = performance.now();
  const before = passed + failed;
  if (name === 'iso-week-py') {
    checkInit(name, mod, ['', '{}', ' { } '],
      [['x', 'not valid JSON'], ['[]', 'JSON object'], ['{"first_month":4}', '"first_month"']]);
    logs.push(...globalThis.__frostlineLogs);
    checkStrategy(name, mod.strategy, isoWeekRef, sampleTimes(N));
  } else {
    for (let fm = 1; fm <= 12; fm++) {
      const cfg = fm === 1 ? '' : `{"first_month": ${fm}}`;
      checkInit(name, mod, [cfg], []);
      if (fm === 12) logs.push(...globalThis.__frostlineLogs);
      // Leave it configured with fm for the strategy checks below.
      checkStrategy(`${name} first_month=${fm}`, mod.strategy, (t) => fiscalRef(t, fm),
        sampleTimes(Math.ceil(N / 4)));
    }
    checkInit(name, mod, ['{}'], [['x', 'not valid JSON'], ['{"first_month":13}', 'first_month'],
      ['{"first_month":4,"tz":"UTC"}', '"tz"']]);
  }
  console.log(`${name}: transpiled+loaded in ${loadMs.toFixed(0)} ms; ${passed + failed - before} checks ` +
    `in ${(performance.now() - t1).toFixed(0)} ms`);
}
console.log('log lines seen:', show(logs));
rmSync(WORK, { recursive: true, force: true });
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
