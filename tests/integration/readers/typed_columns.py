"""Reads a frostline Delta table's typed columns (`[[table.column]]`) without frostline.

usage: typed_columns.py aggregate|prune|duckdb-prune|column TABLE_DIR [ARGS]

`aggregate` prints, as JSON, the average and the count of `dep_delay` per `carrier`, computed
by DuckDB (over the table's data files, listed from its log), polars (`scan_delta`) and
delta-rs (`to_pyarrow_table`), each once from the typed columns and once from `body` (JSON text,
as without declared columns): {"duckdb_typed": {"AA": [avg, count], ...}, "duckdb_body": ...}.

`prune TABLE_DIR CARRIER DAY_START DAY_END` prints how many data files delta-rs
(`file_uris` with a pruning predicate) and polars (`scan_delta`, the files its plan keeps) read
for `carrier = CARRIER`, and for `sched_dep` in [DAY_START, DAY_END), out of all of them.

`duckdb-prune TABLE_DIR CARRIER` overwrites, in a copy of the table's files, the data pages of
every file without CARRIER (footers kept) and prints whether DuckDB still answers
`carrier = CARRIER` over them (it skips row groups by their statistics) while a query without
that condition fails.

`column TABLE_DIR NAME` prints the values of the typed column NAME as polars and delta-rs read
them, in (event_time, sort_key) order, and the Delta schema's type of it.
"""
import datetime
import json
import math
import os
import re
import sys

command, uri = sys.argv[1], sys.argv[2]
uri_of_table = uri


def carrier_key(value):
    return "null" if value is None else value


def rounded(rows):
    # avg to 9 digits: the readers sum in different orders.
    return {carrier_key(k): [None if a is None else round(a, 9), c] for k, a, c in rows}


def by_python(records, carrier, delay):
    groups = {}
    for r in records:
        groups.setdefault(carrier(r), []).append(delay(r))
    out = []
    for k, values in groups.items():
        present = [v for v in values if v is not None]
        out.append((k, sum(present) / len(present) if present else None, len(present)))
    return rounded(out)


def aggregate():
    import duckdb
    import polars as pl
    from deltalake import DeltaTable

    table = DeltaTable(uri)
    files = table.file_uris()
    out = {}
    con = duckdb.connect()
    source = f"read_parquet({files!r}, union_by_name = true)"
    out["duckdb_typed"] = rounded(
        con.sql(f"select carrier, avg(dep_delay), count(dep_delay) from {source} group by carrier").fetchall()
    )
    out["duckdb_body"] = rounded(
        con.sql(
            "select json_extract_string(body, '$.carrier') as c, "
            "avg(cast(json_extract_string(body, '$.dep_delay') as bigint)), "
            "count(cast(json_extract_string(body, '$.dep_delay') as bigint)) "
            f"from {source} group by c"
        ).fetchall()
    )
    frame = pl.scan_delta(uri)
    typed = (
        frame.group_by("carrier")
        .agg(pl.col("dep_delay").mean().alias("avg"), pl.col("dep_delay").count().alias("n"))
        .collect()
    )
    out["polars_typed"] = rounded(typed.rows())
    from_body = (
        frame.select(
            pl.col("body").str.json_path_match("$.carrier").alias("c"),
            pl.col("body").str.json_path_match("$.dep_delay").cast(pl.Int64).alias("d"),
        )
        .group_by("c")
        .agg(pl.col("d").mean().alias("avg"), pl.col("d").count().alias("n"))
        .collect()
    )
    out["polars_body"] = rounded(from_body.rows())
    rows = table.to_pyarrow_table(columns=["carrier", "dep_delay", "body"]).to_pylist()
    out["deltalake_typed"] = by_python(rows, lambda r: r["carrier"], lambda r: r["dep_delay"])
    bodies = [json.loads(r["body"]) for r in rows]
    out["deltalake_body"] = by_python(bodies, lambda b: b.get("carrier"), lambda b: b.get("dep_delay"))
    return out


def polars_files(frame):
    # The plan names the files it reads: "SCAN [a, b]" or "SCAN [a, ... 3 other sources]".
    plan = frame.explain()
    listed = re.search(r"SCAN \[(.*?)\]", plan)
    if listed is None:
        return 0
    others = re.search(r"\.\.\. (\d+) other sources", listed.group(1))
    return 1 + int(others.group(1)) if others else len(listed.group(1).split(", "))


def prune(carrier, start, end):
    import polars as pl
    from deltalake import DeltaTable

    table = DeltaTable(uri)
    utc = datetime.timezone.utc
    parse = lambda t: datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).astimezone(utc)
    frame = pl.scan_delta(uri)
    return {
        "all": len(table.file_uris()),
        "deltalake_carrier": len(table.file_uris(file_pruning_predicate=f"carrier = '{carrier}'")),
        "polars_carrier": polars_files(frame.filter(pl.col("carrier") == carrier)),
        "deltalake_day": len(
            table.file_uris(file_pruning_predicate=f"sched_dep >= '{start}' and sched_dep < '{end}'")
        ),
        "polars_day": polars_files(
            frame.filter((pl.col("sched_dep") >= parse(start)) & (pl.col("sched_dep") < parse(end)))
        ),
    }


def duckdb_reads_only(carrier):
    """DuckDB over the table's files (listed) with `carrier = CARRIER`, after the data pages of
    every file without that carrier are overwritten (footers and their statistics intact, in a
    copy): it answers only if it skips those files' row groups by their statistics."""
    import shutil
    import struct
    import tempfile

    import duckdb
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    copy = tempfile.mkdtemp()
    files = []
    for i, uri in enumerate(DeltaTable(uri_of_table).file_uris()):
        path = os.path.join(copy, f"{i}.parquet")
        shutil.copy(uri.removeprefix("file://"), path)
        files.append(path)
    spoiled = 0
    for path in files:
        if carrier in pq.read_table(path, columns=["carrier"]).column("carrier").to_pylist():
            continue
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size - 8)
            footer = struct.unpack("<i", f.read(4))[0]
            f.seek(4)
            f.write(b"\xff" * (size - 8 - footer - 4))
        spoiled += 1
    con = duckdb.connect()
    source = f"read_parquet({files!r})"
    found = con.execute(f"select count(*) from {source} where carrier = ?", [carrier]).fetchone()[0]
    try:
        con.execute(f"select count(*) from {source} where dep_delay > -1000000").fetchone()
        unfiltered = "read"
    except Exception as e:  # the spoiled pages, read without a condition that skips them
        unfiltered = "failed"
    shutil.rmtree(copy)
    return {"files": len(files), "spoiled": spoiled, "found": found, "unfiltered": unfiltered}


def column(name):
    import polars as pl
    from deltalake import DeltaTable

    table = DeltaTable(uri)
    kind = next(f.type for f in table.schema().fields if f.name == name)
    order = ["event_time", "sort_key"]
    polars_values = pl.read_delta(uri).sort(order)[name].to_list()
    delta_values = table.to_pyarrow_table().sort_by([(c, "ascending") for c in order]).column(name).to_pylist()

    def plain(v):
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        return v.isoformat() if isinstance(v, datetime.datetime) else v

    return {
        "type": str(kind),
        "polars": [plain(v) for v in polars_values],
        "deltalake": [plain(v) for v in delta_values],
    }


if command == "aggregate":
    result = aggregate()
elif command == "prune":
    result = prune(*sys.argv[3:6])
elif command == "column":
    result = column(sys.argv[3])
elif command == "duckdb-prune":
    result = duckdb_reads_only(sys.argv[3])
else:
    sys.exit(f"unknown command {command}")
print(json.dumps(result, sort_keys=True))
sys.stdout.flush()
# As read_delta.py: delta-rs's and polars' threads can abort the interpreter's normal exit.
os._exit(0)
