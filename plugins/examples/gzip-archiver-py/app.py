"""frostline example plugin: an `archiver` that gzip-compresses every object on its way into
the blob store the host lends it, and decompresses it on the way out.

Built with componentize-py 0.25.1 (see ../build.sh):

    componentize-py -d ../../../wit -w archiver componentize app -o gzip-archiver-py.wasm

It stores nothing itself: every call goes to the `blob-store` import, which the host binds to
the native target named by the policy's grant for this component's SHA-256, for example

    [[target]]
    name = "cold"
    url = "file:///srv/frostline/cold"

    [[target]]
    name = "cold-gzip"
    plugin = "gzip-archiver-py.wasm"
    config = { level = 6 }

    [[grant]]
    sha256 = "<sha256sum gzip-archiver-py.wasm>"
    blob_store = "cold"

Without the grant every blob store call answers `permanent("not granted: ...")`, so the
target fails its conformance checks at load. Keys are passed through unchanged; objects are
stored as gzip members with a zero timestamp (the same bytes give the same object, which the
engine's compare-on-conflict relies on). An object that is not gzip is reported as a
`permanent` error, never returned as is.

Config: empty, `{}` or `{"level": N}` with N an integer 1..9 (default 6).
"""

import gzip
import json
import zlib
from typing import List, Optional

import wit_world
from wit_world import exports
from wit_world.imports import blob_store, log
from wit_world.imports.types import BackendError_Permanent
from componentize_py_types import Err

KNOWN_CONFIG_FIELDS = frozenset({"level"})
level = 6


def _parse_config(config: str) -> int:
    if config.strip() == "":
        return 6
    try:
        value = json.loads(config)
    except ValueError as e:
        raise Err(f"gzip-archiver: config is not valid JSON ({e}): {config[:200]}")
    if not isinstance(value, dict):
        raise Err(f"gzip-archiver: config must be a JSON object (or empty), got {json.dumps(value)[:200]}")
    unknown = sorted(k for k in value if k not in KNOWN_CONFIG_FIELDS)
    if unknown:
        raise Err(
            f"gzip-archiver: unknown config field(s) {', '.join(json.dumps(k) for k in unknown)}; "
            "the only field is \"level\""
        )
    chosen = value.get("level", 6)
    # bool is an int in Python: refuse it explicitly.
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 1 <= chosen <= 9:
        raise Err(f"gzip-archiver: level must be an integer 1..9, got {json.dumps(chosen)}")
    return chosen


class WitWorld(wit_world.WitWorld):
    def init(self, config: str) -> None:
        global level
        level = _parse_config(config)
        log.log(log.Level.INFO, f"gzip archiver initialised (level {level})")


# Errors from the blob store (`Err(BackendError)`) propagate unchanged: they are this
# backend's answers too.
class Backend(exports.Backend):
    def put(self, key: str, data: bytes) -> None:
        blob_store.put(key, gzip.compress(data, compresslevel=level, mtime=0))

    def get(self, key: str) -> bytes:
        stored = blob_store.get(key)
        try:
            return gzip.decompress(stored)
        except (OSError, EOFError, zlib.error) as e:
            raise Err(BackendError_Permanent(f"gzip-archiver: object `{key}` is not valid gzip: {e}"))

    def delete(self, key: str) -> None:
        blob_store.delete(key)

    def list(self, prefix: str, after: Optional[str], limit: int) -> List[str]:
        return blob_store.list(prefix, after, limit)
