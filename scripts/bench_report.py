#!/usr/bin/env python3
"""Turns the JSON document of `cargo bench --bench frostline-bench -- --json FILE` into
BENCHMARKS.md. Run by scripts/bench; usage: bench_report.py BENCH_JSON OUTPUT_MD [--merge PREVIOUS_JSON].

With --merge, the scenarios of BENCH_JSON replace those of the same name in PREVIOUS_JSON and the
others are kept, each scenario keeping the commit, date, machine and command it was measured
with; the merged document is written back to BENCH_JSON, so the next merge builds on it."""

import json
import sys

# The targets BENCHMARKS.md checks, by scenario: ("ratio_min", least ratio to the baseline) or
# ("max", most value in the figure's unit), from the issues. A scenario that ran without a figure
# carrying one of its targets reports that target as missed, so a target cannot drop out of the
# report unnoticed.
TARGETS = {
    "plugin-call": [("ratio_min", 0.95)],  # the cached strategy path at >= 95% of native speed
    "append": [
        ("ratio_min", 0.7),  # Engine::append at >= 70% of plain redb inserts of the same records
        ("ratio_min", 0.95),  # appends with the WASM strategy at >= 95% of the native strategy
    ],
    "archive": [
        ("ratio_min", 0.6),  # a pass at >= 60% of the I/O floor (write, fsync, read back, SHA-256)
        ("ratio_min", 0.7),  # appends during a pass at >= 70% of the same without one
        ("max", 50.0),  # a 1,000-record append during a pass under 50 ms at the 99th percentile
        ("ratio_min", 1.5),  # a pass at >= 1.5x restic backing up the same bytes
    ],
    "archive-large": [
        ("ratio_min", 0.6),  # the same pass ratio with 2,000,000 rows in the same buckets
        ("ratio_min", 1.5),  # and against restic
    ],
    "reload": [
        ("max", 250.0),  # a renamed policy file with built-in plugins active within 250 ms (median)
        ("max", 250.0),  # the same with a plugin file from the compiled cache
    ],
    "formats": [("ratio_min", 1 / 3)],  # a cold query of one bucket within 3x of the hot query
    "delta": [("ratio_min", 0.9)],  # archive throughput with the Delta log at >= 90% of without
    "scale": [("ratio_min", 0.5)],  # a pass over 1,000,000 buckets within 2x of one over 1,000
    "scale-archived": [("ratio_min", 0.5)],  # work over 1,000,000 archived buckets within 2x of 1,000
    "typed": [
        ("ratio_min", 0.9),  # the archive pass with five declared columns at >= 90% of the rate without
        ("ratio_min", 5.0),  # DuckDB's aggregate over a typed column >= 5x faster than through json_extract on body
    ],
    "read": [
        ("ratio_min", 1.0),  # hot reads at least as fast as archived ones
        ("ratio_min", 0.5),  # a ten-year query of archived Parquet at >= 0.5 of DuckDB on the same files
    ],
    "footprint": [
        ("max", 200.0),  # start-up from the compiled cache under 200 ms
        ("max", 64.0),  # idle resident memory under 64 MiB
        ("max", 256.0),  # `frostline ingest` of a 2 GiB file peaks under 256 MiB resident
        ("max", 256.0),  # archiving one bucket of 2 GiB peaks under 256 MiB resident
        ("max", 64.0),  # a query page of 1,000 records takes under 64 MiB whatever the bucket size
    ],
}


def number(value):
    """About four significant digits, thousands separated, no exponent."""
    if value is None:
        return ""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 10:
        return f"{value:.2f}"
    return f"{value:.3f}"


# Units of a size: less is better, as for a duration, and the words say smaller or larger.
SIZE_UNITS = ("bytes", "MiB")


def ratio(value, unit=None):
    """`0.117 (8.5x slower)` below 1, else the plain number; a size's says larger or smaller."""
    if unit in SIZE_UNITS:
        return f"{value:.3f} ({1 / value:.1f}x larger)" if value < 1 else f"{number(value)} ({value:.1f}x smaller)"
    if value < 1:
        return f"{value:.3f} ({1 / value:.1f}x slower)"
    return number(value)


def ratio_text(figure):
    baseline = figure.get("baseline")
    return ratio(baseline["ratio"], figure["unit"]) if baseline else ""


def escape(text):
    return text.replace("|", "\\|")


def target_text(target):
    if target.get("ratio_min") is not None:
        return f"ratio >= {target['ratio_min']:.3g}"
    limit = target["max"]
    return f"<= {limit:,.0f}" if float(limit).is_integer() else f"<= {limit:g}"


def target_met(figure):
    """Checked from the figures themselves, not from the harness's verdict."""
    target = figure["target"]
    if target.get("ratio_min") is not None:
        return figure["baseline"]["ratio"] >= target["ratio_min"]
    return figure["median"] <= target["max"]


def measured_text(figure):
    target = figure["target"]
    if target.get("ratio_min") is not None:
        b = figure["baseline"]
        return (f"ratio {ratio(b['ratio'], figure['unit'])} "
                f"({number(figure['median'])} vs {number(b['median'])} {figure['unit']})")
    return f"{number(figure['median'])} {figure['unit']}"


def unmeasured_targets(doc):
    """(scenario, target text) for every target of a scenario that ran without a figure carrying it."""
    out = []
    for scenario in doc["scenarios"]:
        name = scenario["name"]
        for kind, bound in TARGETS.get(name, []):
            if not any(f["scenario"] == name and f.get("target") and f["target"].get(kind) is not None
                       and abs(f["target"][kind] - bound) < 1e-9 for f in doc["figures"]):
                out.append((name, target_text({kind: bound})))
    return out


def machine_text(machine):
    return f"{machine['cpu_model']}, {machine['nproc']} cores, {machine['memory_bytes'] / 2**30:.1f} GiB"


def run_of(doc, scenario):
    """The run a scenario was measured in: its own (after a merge) or the document's."""
    return scenario.get("run") or {k: doc[k] for k in ("commit", "date", "machine", "options", "command")}


def merge(previous, new):
    """`new`'s scenarios replace `previous`'s of the same name; every scenario carries its run."""
    for doc in (previous, new):
        for scenario in doc["scenarios"]:
            scenario["run"] = run_of(doc, scenario)
    names = {s["name"] for s in new["scenarios"]}
    kept = [s for s in previous["scenarios"] if s["name"] not in names]
    order = [s["name"] for s in previous["scenarios"]]
    merged = dict(new)
    # The header's command reproduces the whole report: the last full run's, unless this was one.
    if " --only " in f"{new['command']} ":
        merged["command"] = previous["command"]
    merged["scenarios"] = sorted(kept + new["scenarios"],
                                 key=lambda s: order.index(s["name"]) if s["name"] in order else len(order))
    merged["figures"] = [f for f in previous["figures"] if f["scenario"] not in names] + new["figures"]
    merged["skipped"] = [k for k in previous["skipped"] if k["scenario"] not in names] + new["skipped"]
    merged["total_seconds"] = sum(s["seconds"] for s in merged["scenarios"])
    return merged


def only_command(doc, scenario):
    """The command that reruns one scenario with the options of this run."""
    parts = ["scripts/bench"]
    if doc["options"]["full"]:
        parts.append("--full")
    parts += ["--only", scenario]
    if doc["options"]["repeats"] != 7:
        parts += ["--repeats", str(doc["options"]["repeats"])]
    prefix = "FROSTLINE_EXAMPLE_PLUGINS=DIR " if scenario == "plugin-load" and "FROSTLINE_EXAMPLE_PLUGINS" in doc["command"] else ""
    return prefix + " ".join(parts)


def render(doc):
    machine = doc["machine"]
    options = doc["options"]
    out = []
    w = out.append
    w("# Benchmarks")
    w("")
    w("Generated by `scripts/bench` from the JSON the harness (`engine/benches/bench/`) writes;")
    w("change the harness or `scripts/bench_report.py`, not this file.")
    w("")
    w("Reproduce with:")
    w("")
    w("```sh")
    w(doc["command"])
    w("```")
    w("")
    w("The Python and JavaScript rows need the example components: build them with "
      "`plugins/examples/build.sh DIR` and set `FROSTLINE_EXAMPLE_PLUGINS=DIR`; without it they are skipped. "
      "The `frostline ingest` row and the footprint scenario run the release binary "
      "(`$CARGO_TARGET_DIR/release/frostline`, which `scripts/bench` builds first); the restic rows run Debian's "
      "restic, which `scripts/bench` unpacks into `.tools/restic`; without them those rows are skipped. "
      "The first run builds wasmtime in release mode (several minutes).")
    w("")
    w(f"- Machine: {machine_text(machine)} RAM; load average {machine['loadavg_start']} at the "
      f"start, {machine['loadavg_end']} at the end.")
    commits = sorted({run_of(doc, s)["commit"] for s in doc["scenarios"]})
    if len(commits) > 1:
        w(f"- Commits: {', '.join(f'`{c}`' for c in commits)}: scenarios were measured in separate runs "
          "(`scripts/bench --only NAME` keeps the others); each section names its own. Latest run: "
          f"{doc['date']}; {doc['rustc']}.")
    else:
        w(f"- Commit: `{doc['commit']}`; date: {doc['date']}; {doc['rustc']}.")
    w(f"- Options: {'`--full`' if options['full'] else 'default run'}, {options['repeats']} runs per figure, "
      f"{options['sample_ms']} ms per sample of a per-operation figure; the whole run took "
      f"{doc['total_seconds']:.0f} s.")
    w(f"- Every figure is the **median of {options['repeats']} runs**, with the min and max beside it: the "
      "machine is shared and noisy, so medians are quoted. Figures that are compared (WASM against "
      "native Rust, appends against plain redb, a pass against the I/O floor) are sampled round by round, "
      "one sample of each per round, so load from elsewhere hits both alike. Rows named \"instrumented ...\" "
      "and \"... rebuilt on plain redb\" time the phases of extra runs (at most 5), and \"phases of the timed "
      "passes\" the phase timings every pass reports, to show where the time goes. Slow compiles of large components are repeated fewer times in the default run "
      "(see the Runs column).")
    w(f"- Ratio: {doc['ratio_definition']}.")
    w("")

    figures = doc["figures"]
    missed = [f for f in figures if f.get("target") and not target_met(f)]
    unmeasured = unmeasured_targets(doc)
    w("## Targets missed")
    w("")
    if missed or unmeasured:
        w("| Scenario | Figure | Measured | Target | Baseline | What limits it |")
        w("|---|---|---|---|---|---|")
        for f in missed:
            t = f["target"]
            b = f.get("baseline")
            w(f"| {f['scenario']} | {escape(f['name'])} | {measured_text(f)} | "
              f"{target_text(t)}: {escape(t['about'])} | {escape(b['name']) if b else ''} | "
              f"{escape(f.get('note', ''))} |")
        for name, text in unmeasured:
            w(f"| {name} | (none) | not measured | {text} | | "
              "the scenario ran but no figure carries this target |")
    else:
        w("None.")
    met = [f for f in figures if f.get("target") and target_met(f)]
    if met:
        w("")
        w("Targets met:")
        w("")
        for f in met:
            t = f["target"]
            w(f"- {f['scenario']} / {f['name']}: {measured_text(f)} (target {target_text(t)}: {t['about']}).")
    if not missed and not met:
        w("")
        w("No figure in this run has a target.")
    w("")

    for scenario in doc["scenarios"]:
        name = scenario["name"]
        w(f"## {name}")
        w("")
        w(f"{scenario['about'][0].upper()}{scenario['about'][1:]}. ({scenario['seconds']:.0f} s)")
        w("")
        run = run_of(doc, scenario)
        w(f"Measured with `{only_command(run, name)}` (or the whole command above) at commit "
          f"`{run['commit']}` ({run['date']}) on {machine_text(run['machine'])}; every figure below is the "
          "median of its Runs.")
        w("")
        rows = [f for f in figures if f["scenario"] == name]
        if rows:
            w("| Figure | Median | Min | Max | Unit | Runs | Ratio | Baseline |")
            w("|---|--:|--:|--:|---|--:|--:|---|")
            for f in rows:
                single = len(f["samples"]) == 1
                missed_mark = " **(misses target)**" if f.get("target") and not target_met(f) else ""
                w(f"| {escape(f['name'])} | {number(f['median'])} | "
                  f"{'' if single else number(f['min'])} | {'' if single else number(f['max'])} | "
                  f"{f['unit']} | {len(f['samples'])} | {ratio_text(f)}{missed_mark} | "
                  f"{escape(f['baseline']['name']) if f.get('baseline') else ''} |")
            w("")
            for f in rows:
                if f.get("note"):
                    w(f"What limits {f['name']}: {f['note'].rstrip('.')}.")
                    w("")
        for skipped in doc["skipped"]:
            if skipped["scenario"] == name:
                w(f"Skipped {', '.join(skipped['rows'])}: {skipped['reason']}")
                w("")
    return "\n".join(out).rstrip() + "\n"


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("schema") != 1:
        sys.exit(f"{path}: unknown schema {doc.get('schema')!r}; expected 1")
    return doc


def main():
    args = sys.argv[1:]
    if len(args) not in (2, 4) or (len(args) == 4 and args[2] != "--merge"):
        sys.exit("usage: bench_report.py BENCH_JSON OUTPUT_MD [--merge PREVIOUS_JSON]")
    doc = load(args[0])
    if len(args) == 4:
        doc = merge(load(args[3]), doc)
        with open(args[0], "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    text = render(doc)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
