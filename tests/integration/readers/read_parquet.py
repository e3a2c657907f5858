"""Reads frostline's archived Parquet segments with DuckDB or pyarrow, without frostline.

usage: read_parquet.py duckdb|pyarrow ARCHIVE_DIR TABLE FROM_MICROS TO_MICROS

Prints one JSON object per record, in (event_time, sort_key, partition_key) order, in the
shape `frostline query` prints. The files are found by the layout of a table whose archive is
also a Delta table: delta/<t>/installation=<i>/bucket=<b>/partition=<p>/*.parquet (the Delta
log's checkpoints, also Parquet, sit in delta/<t>/_delta_log/ and are left out).
"""
import json
import sys

engine, root, table, lo, hi = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
pattern = f"{root}/delta/{table}/installation=*/**/*.parquet"
rows = []
if engine == "duckdb":
    import duckdb

    query = f"""
        SELECT partition_key, epoch_us(event_time) AS t, sort_key, tenant, kind, body
        FROM read_parquet('{pattern}', hive_partitioning = true)
        WHERE event_time >= make_timestamp({lo}) AND event_time < make_timestamp({hi})
        ORDER BY t, sort_key, partition_key
    """
    rows = duckdb.sql(query).fetchall()
elif engine == "pyarrow":
    import glob

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for path in sorted(glob.glob(pattern, recursive=True)):
        t = pq.read_table(path)
        micros = pc.cast(t["event_time"], "int64").to_pylist()
        for i, m in enumerate(micros):
            if lo <= m < hi:
                rows.append((t["partition_key"][i].as_py(), m, t["sort_key"][i].as_py(), t["tenant"][i].as_py(),
                             t["kind"][i].as_py(), t["body"][i].as_py()))
    rows.sort(key=lambda r: (r[1], r[2], r[0]))
else:
    sys.exit(f"unknown engine {engine}")

for partition_key, t, sort_key, tenant, kind, body in rows:
    record = {"partition_key": partition_key, "event_time": t, "sort_key": sort_key}
    if tenant is not None:
        record["tenant"] = tenant
    if kind is not None:
        record["kind"] = kind
    record["body"] = json.loads(body)
    print(json.dumps(record, ensure_ascii=False))
