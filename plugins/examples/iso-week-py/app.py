"""frostline example plugin: ISO-8601 weeks in UTC, as a `bucket-strategy` component.

Built with componentize-py 0.25.1 (see ../build.sh):

    componentize-py -d ../../../wit -w bucket-strategy componentize app -o iso-week-py.wasm

Keys look like `week:2020-W53` (ISO week-numbering year and week). A bucket starts on Monday
00:00 UTC and lasts 7 days. Times and bounds are microseconds since the Unix epoch (s64).
Supported: ISO week-years 0001..9999; other times answer an error.

Config: the empty string or the JSON object `{}`; this strategy has no settings.
"""

import json
from typing import List

import wit_world
from wit_world import exports
from wit_world.imports import log
from wit_world.imports.types import BucketDescriptor
from componentize_py_types import Err

from isoweek import OutOfRange, week_bucket

KNOWN_CONFIG_FIELDS: frozenset = frozenset()


def _parse_config(config: str) -> None:
    if config.strip() == "":
        return
    try:
        value = json.loads(config)
    except ValueError as e:
        raise Err(f"iso-week: config is not valid JSON ({e}): {config[:200]}")
    if not isinstance(value, dict):
        raise Err(
            f"iso-week: config must be a JSON object (or empty), got {json.dumps(value)[:200]}"
        )
    unknown = sorted(k for k in value if k not in KNOWN_CONFIG_FIELDS)
    if unknown:
        raise Err(
            f"iso-week: unknown config field(s) {', '.join(json.dumps(k) for k in unknown)}; "
            "this strategy takes no settings (use \"\" or \"{}\")"
        )


def _bucket(t: int) -> BucketDescriptor:
    try:
        key, start, end = week_bucket(t)
    except OutOfRange as e:
        raise Err(f"iso-week: {e}")
    return BucketDescriptor(key=key, start=start, end=end)


class WitWorld(wit_world.WitWorld):
    def init(self, config: str) -> None:
        _parse_config(config)
        log.log(log.Level.INFO, "iso-week strategy initialised (ISO-8601 weeks, UTC)")


class Strategy(exports.Strategy):
    def bucket_for(self, event_time: int) -> BucketDescriptor:
        return _bucket(event_time)

    def buckets_for(self, event_times: List[int]) -> List[BucketDescriptor]:
        out = []
        for i, t in enumerate(event_times):
            try:
                out.append(_bucket(t))
            except Err as e:
                # One bad time fails the whole batch; say which one.
                raise Err(f"event-times[{i}]: {e.value}")
        return out
