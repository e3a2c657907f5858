// {{name}}: a frostline retention policy. It archives a bucket `archive_after_days` days after
// the bucket ends and never expires it. Replace `plan` with your own rule; keep it a pure
// function of `now`, the bucket's facts and the config.
//
// Times are s64 microseconds since the epoch, which arrive as BigInt.
//
// Config: empty, `{}` or `{"archive_after_days": N}` with N from 0 to 36,500 (default 7).

import { log } from 'frostline:plugin/log@0.1.0';

const MICROS_PER_DAY = 86_400_000_000n;
const I64_MAX = 2n ** 63n - 1n;

let archiveAfterDays = 7;

function parseConfig(config) {
  if (config.trim() === '') return 7;
  let value;
  try {
    value = JSON.parse(config);
  } catch (e) {
    throw `{{name}}: config is not valid JSON (${String(e && e.message)}): ${config.slice(0, 200)}`;
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw `{{name}}: config must be a JSON object (or empty), got ${JSON.stringify(value).slice(0, 200)}`;
  }
  const unknown = Object.keys(value).filter((k) => k !== 'archive_after_days');
  if (unknown.length > 0) {
    throw `{{name}}: unknown config field(s) ${unknown.join(', ')}; the only field is "archive_after_days"`;
  }
  const days = value.archive_after_days ?? 7;
  if (!Number.isInteger(days) || days < 0 || days > 36500) {
    throw `{{name}}: archive_after_days must be an integer 0 to 36500, got ${JSON.stringify(days)}`;
  }
  return days;
}

export function init(config) {
  archiveAfterDays = parseConfig(config);
  log('info', '{{name}} initialised');
}

export const policy = {
  plan(now, buckets) {
    return buckets.map((facts) => {
      let archiveAt = facts.bucket.end + BigInt(archiveAfterDays) * MICROS_PER_DAY;
      if (archiveAt > I64_MAX) archiveAt = I64_MAX;
      return {
        tag: 'ok',
        val: {
          archiveAt,
          expireAt: undefined,
          reason: `archive ${archiveAfterDays} days after the bucket ends; never expire`,
        },
      };
    });
  },
};
