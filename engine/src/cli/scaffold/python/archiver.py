"""{{name}}: a frostline archiver. It passes every call to the blob store the engine lends it
(a native target named by the policy's `[[grant]]` for this component's SHA-256). Replace the
calls with your own store; keep `put` create-only and durable when it answers ok, and raise
errors as `Err(BackendError_...)` values.

Config: empty or `{}`.
"""

from typing import List, Optional

import wit_world
from wit_world import exports
from wit_world.imports import blob_store, log
from componentize_py_types import Err


class WitWorld(wit_world.WitWorld):
    def init(self, config: str) -> None:
        if config.strip() not in ("", "{}"):
            raise Err(f"{{name}}: this archiver takes no settings (use \"\" or \"{{}}\"), got {config[:200]}")
        log.log(log.Level.INFO, "{{name}} initialised")


class Backend(exports.Backend):
    def put(self, key: str, data: bytes) -> None:
        blob_store.put(key, data)

    def get(self, key: str) -> bytes:
        return blob_store.get(key)

    def delete(self, key: str) -> None:
        blob_store.delete(key)

    def list(self, prefix: str, after: Optional[str], limit: int) -> List[str]:
        return blob_store.list(prefix, after, limit)
