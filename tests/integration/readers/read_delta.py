"""Reads a frostline table's archive as a Delta Lake table, without frostline.

usage: read_delta.py deltalake|polars|files|uris|vacuum TABLE_URI [VERSION]

`deltalake` and `polars` print one JSON object per record, in (event_time, sort_key,
partition_key) order: the record as `frostline query` prints it, plus the Delta table's
partition columns `installation`, `bucket` and `partition` under "_delta". `files` prints the
number of data files the version lists, `uris` their URIs as a JSON list. `vacuum` runs delta-rs's lite VACUUM with no retention
period (every file the log removed is deleted at once) and prints the deleted paths as a JSON
list. Object storage options come from the environment
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), as delta-rs and polars read them.
"""
import json
import os
import sys

reader, uri = sys.argv[1], sys.argv[2]
version = int(sys.argv[3]) if len(sys.argv) > 3 else None
options = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
if options:
    options["AWS_ALLOW_HTTP"] = "true"

if reader == "files":
    from deltalake import DeltaTable

    print(len(DeltaTable(uri, version=version, storage_options=options or None).file_uris()))
    sys.stdout.flush()
    os._exit(0)
if reader == "uris":
    from deltalake import DeltaTable

    print(json.dumps(DeltaTable(uri, version=version, storage_options=options or None).file_uris()))
    sys.stdout.flush()
    os._exit(0)
if reader == "vacuum":
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=options or None)
    deleted = table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    print(json.dumps(sorted(deleted)))
    sys.stdout.flush()
    os._exit(0)
if reader == "deltalake":
    from deltalake import DeltaTable

    rows = DeltaTable(uri, version=version, storage_options=options or None).to_pyarrow_table().to_pylist()
elif reader == "polars":
    import polars as pl

    rows = pl.read_delta(uri, version=version, storage_options=options or None).to_dicts()
else:
    sys.exit(f"unknown reader {reader}")


def micros(t):
    # pyarrow and polars give timezone-aware datetimes; frostline prints microseconds.
    import datetime

    return (t - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(microseconds=1)


rows.sort(key=lambda r: (micros(r["event_time"]), r["sort_key"], r["partition_key"]))
for r in rows:
    record = {"partition_key": r["partition_key"], "event_time": micros(r["event_time"]), "sort_key": r["sort_key"]}
    if r["tenant"] is not None:
        record["tenant"] = r["tenant"]
    if r["kind"] is not None:
        record["kind"] = r["kind"]
    record["body"] = json.loads(r["body"])
    record["_delta"] = {"installation": r["installation"], "bucket": r["bucket"], "partition": r["partition"]}
    print(json.dumps(record, ensure_ascii=False))
# deltalake's object store threads can abort the interpreter's teardown ("terminate called
# without an active exception", now and then against S3): everything is printed by now.
sys.stdout.flush()
os._exit(0)
