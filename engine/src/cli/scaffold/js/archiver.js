// {{name}}: a frostline archiver. It passes every call to the blob store the engine lends it
// (a native target named by the policy's `[[grant]]` for this component's SHA-256). Replace
// the calls with your own store; keep `put` create-only and durable when it answers ok, and
// throw errors as backend-error values (`{ tag: 'permanent', val: 'why' }`).
//
// Config: empty or `{}`.

import { log } from 'frostline:plugin/log@0.1.0';
import * as blobStore from 'frostline:plugin/blob-store@0.1.0';

export function init(config) {
  if (config.trim() !== '' && config.trim() !== '{}') {
    throw `{{name}}: this archiver takes no settings (use "" or "{}"), got ${config.slice(0, 200)}`;
  }
  log('info', '{{name}} initialised');
}

export const backend = {
  put(key, bytes) {
    blobStore.put(key, bytes);
  },
  get(key) {
    return blobStore.get(key);
  },
  delete(key) {
    blobStore.delete(key);
  },
  list(prefix, after, limit) {
    return blobStore.list(prefix, after, limit);
  },
};
