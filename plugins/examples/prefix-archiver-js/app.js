// frostline example plugin: an `archiver` that keeps every object under a fixed key prefix in
// the blob store the host lends it, so one bucket can hold frostline's archive beside other
// data (or several frostline installations side by side).
//
// Built with componentize-js 0.23.0 (SpiderMonkey); see ../build.sh:
//
//   componentize-js app.js --wit ../../../wit --world-name archiver \
//     -d stdio random clocks http fetch-event -o prefix-archiver-js.wasm
//
// It stores nothing itself: every call goes to the `blob-store` import, which the host binds
// to the native target named by the policy's grant for this component's SHA-256. Without the
// grant every call answers `permanent("not granted: ...")` and the target fails its checks at
// load.
//
// Config (JSON): {"prefix": "..."}: 1 to 256 bytes of visible ASCII, without a leading `/`;
// the empty string or {} means "frostline/". The engine's key `table=t/...` is stored as
// `frostline/table=t/...`; `list` strips the prefix again.
//
// componentize-js conventions used here (checked against 0.23.0):
// - `list<u8>` arrives as a Uint8Array; `option<string>` is a string or undefined.
// - A `result<_, backend-error>` import returns its value, or throws a ComponentError whose
//   `payload` is the error variant ({tag: 'not-found'}, {tag: 'transient', val: '...'}).
// - An export answers `err(e)` when it throws a non-Error value `e` (a variant object here),
//   or an error with a `payload` (so a ComponentError from the import passes through
//   unchanged). Any other Error escapes and traps the instance, so none is thrown here.

import { log } from 'frostline:plugin/log@0.1.0';
import * as blobStore from 'frostline:plugin/blob-store@0.1.0';

const DEFAULT_PREFIX = 'frostline/';
const PREFIX_BYTES_MAX = 256;
const CONFIG_FIELDS = ['prefix'];

let prefix = DEFAULT_PREFIX;

function permanent(message) {
  return { tag: 'permanent', val: `prefix-archiver: ${message}` };
}

// Returns the prefix the config asks for, or throws the refusal as a string (`err(string)`).
export function parseConfig(config) {
  if (config.trim() === '') return DEFAULT_PREFIX;
  let value;
  try {
    value = JSON.parse(config);
  } catch (e) {
    throw `prefix-archiver: config is not valid JSON (${String(e && e.message)}): ${config.slice(0, 200)}`;
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw `prefix-archiver: config must be a JSON object (or empty), got ${JSON.stringify(value).slice(0, 200)}`;
  }
  const unknown = Object.keys(value).filter((k) => !CONFIG_FIELDS.includes(k));
  if (unknown.length > 0) {
    throw `prefix-archiver: unknown config field(s) ${unknown.map((k) => JSON.stringify(k)).join(', ')}; the only field is "prefix"`;
  }
  if (value.prefix === undefined) return DEFAULT_PREFIX;
  const p = value.prefix;
  if (typeof p !== 'string' || p.length === 0 || p.length > PREFIX_BYTES_MAX || !/^[\x21-\x7e]+$/.test(p) || p.startsWith('/')) {
    throw `prefix-archiver: prefix must be 1 to ${PREFIX_BYTES_MAX} bytes of visible ASCII without a leading "/", got ${JSON.stringify(p)}`;
  }
  return p;
}

export function init(config) {
  prefix = parseConfig(config);
  log('info', `prefix archiver initialised (prefix ${JSON.stringify(prefix)})`);
}

export const backend = {
  put(key, bytes) {
    blobStore.put(prefix + key, bytes);
  },

  get(key) {
    return blobStore.get(prefix + key);
  },

  delete(key) {
    blobStore.delete(prefix + key);
  },

  list(listPrefix, after, limit) {
    const keys = blobStore.list(prefix + listPrefix, after === undefined || after === null ? undefined : prefix + after, limit);
    const out = [];
    for (const key of keys) {
      if (!key.startsWith(prefix)) {
        // The host filters by prefix, so this means the store misbehaved: say so.
        throw permanent(`the blob store listed ${JSON.stringify(key)}, outside the prefix`);
      }
      out.push(key.slice(prefix.length));
    }
    return out;
  },
};
