"""Reads frostline's archived Parquet segments with DuckDB or pyarrow, without frostline.

usage: read_parquet.py duckdb|pyarrow|pyspark ARCHIVE_DIR TABLE FROM_MICROS TO_MICROS

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
elif engine == "pyspark":
    # Spark in local mode, finding the files by Hive partition discovery below the table root
    # (partition values kept as strings: bucket keys look like dates).
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    base = f"{root}/delta/{table}"
    df = spark.read.option("basePath", base).parquet(f"{base}/installation=*")
    df = df.withColumn("t", F.unix_micros(F.col("event_time"))).where((F.col("t") >= lo) & (F.col("t") < hi))
    rows = [(r["partition_key"], r["t"], r["sort_key"], r["tenant"], r["kind"], r["body"])
            for r in df.select("partition_key", "t", "sort_key", "tenant", "kind", "body").collect()]
    rows.sort(key=lambda r: (r[1], r[2], r[0]))
    spark.stop()
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
