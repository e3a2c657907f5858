// {{name}}: a frostline bucket strategy. It puts each event time into its UTC day, keyed
// `day:<days since 1970-01-01>`. Replace `bucket` with your own rule; keep it a pure function
// of the time and the config (the engine checks that it answers alike every time).
//
// Times are s64 microseconds since the epoch, which arrive as BigInt.
//
// Config: empty or `{}`.

import { log } from 'frostline:plugin/log@0.1.0';

const MICROS_PER_DAY = 86_400_000_000n;
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

function bucket(t) {
  let day = t / MICROS_PER_DAY; // BigInt division truncates toward zero: floor it
  if (t % MICROS_PER_DAY < 0n) day -= 1n;
  const start = day * MICROS_PER_DAY;
  const end = start + MICROS_PER_DAY;
  if (start < I64_MIN || end > I64_MAX) throw `{{name}}: the day of ${t} does not fit in i64 microseconds`;
  return { key: `day:${day}`, start, end };
}

export function init(config) {
  if (config.trim() !== '' && config.trim() !== '{}') {
    throw `{{name}}: this strategy takes no settings (use "" or "{}"), got ${config.slice(0, 200)}`;
  }
  log('info', '{{name}} initialised');
}

export const strategy = {
  bucketFor(eventTime) {
    return bucket(eventTime);
  },
  bucketsFor(eventTimes) {
    return Array.from(eventTimes, bucket);
  },
};
