"""{{name}}: a frostline bucket strategy. It puts each event time into its UTC day, keyed
`day:<days since 1970-01-01>`. Replace `_bucket` with your own rule; keep it a pure function
of the time and the config (the engine checks that it answers alike every time).

Config: empty or `{}`.
"""

import json
from typing import List

import wit_world
from wit_world import exports
from wit_world.imports import log
from wit_world.imports.types import BucketDescriptor
from componentize_py_types import Err

MICROS_PER_DAY = 86_400_000_000
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def _bucket(t: int) -> BucketDescriptor:
    day = t // MICROS_PER_DAY  # floor division: times before 1970 fall in their own day
    start, end = day * MICROS_PER_DAY, (day + 1) * MICROS_PER_DAY
    if start < I64_MIN or end > I64_MAX:
        raise Err(f"{{name}}: the day of {t} does not fit in i64 microseconds")
    return BucketDescriptor(key=f"day:{day}", start=start, end=end)


class WitWorld(wit_world.WitWorld):
    def init(self, config: str) -> None:
        if config.strip() not in ("", "{}"):
            raise Err(f"{{name}}: this strategy takes no settings (use \"\" or \"{{}}\"), got {config[:200]}")
        log.log(log.Level.INFO, "{{name}} initialised")


class Strategy(exports.Strategy):
    def bucket_for(self, event_time: int) -> BucketDescriptor:
        return _bucket(event_time)

    def buckets_for(self, event_times: List[int]) -> List[BucketDescriptor]:
        return [_bucket(t) for t in event_times]
