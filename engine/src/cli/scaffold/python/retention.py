"""{{name}}: a frostline retention policy. It archives a bucket `archive_after_days` days after
the bucket ends and never expires it. Replace `_plan` with your own rule; keep it a pure
function of `now`, the bucket's facts and the config.

Config: empty, `{}` or `{"archive_after_days": N}` with N from 0 to 36,500 (default 7).
"""

import json
from typing import List

import wit_world
from wit_world import exports
from wit_world.imports import log
from wit_world.imports.types import BucketFacts, RetentionPlan
from componentize_py_types import Err, Ok, Result

MICROS_PER_DAY = 86_400_000_000
I64_MAX = 2**63 - 1
archive_after_days = 7


def _parse_config(config: str) -> int:
    if config.strip() == "":
        return 7
    try:
        value = json.loads(config)
    except ValueError as e:
        raise Err(f"{{name}}: config is not valid JSON ({e}): {config[:200]}")
    if not isinstance(value, dict):
        raise Err(f"{{name}}: config must be a JSON object (or empty), got {json.dumps(value)[:200]}")
    unknown = sorted(k for k in value if k != "archive_after_days")
    if unknown:
        raise Err(f"{{name}}: unknown config field(s) {', '.join(unknown)}; the only field is \"archive_after_days\"")
    days = value.get("archive_after_days", 7)
    if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days <= 36_500:
        raise Err(f"{{name}}: archive_after_days must be an integer 0 to 36500, got {json.dumps(days)}")
    return days


def _plan(facts: BucketFacts) -> RetentionPlan:
    archive_at = min(facts.bucket.end + archive_after_days * MICROS_PER_DAY, I64_MAX)
    return RetentionPlan(
        archive_at=archive_at,
        expire_at=None,
        reason=f"archive {archive_after_days} days after the bucket ends; never expire",
    )


class WitWorld(wit_world.WitWorld):
    def init(self, config: str) -> None:
        global archive_after_days
        archive_after_days = _parse_config(config)
        log.log(log.Level.INFO, "{{name}} initialised")


class Policy(exports.Policy):
    def plan(self, now: int, buckets: List[BucketFacts]) -> List[Result[RetentionPlan, str]]:
        return [Ok(_plan(facts)) for facts in buckets]
