"""Pool the JSON lines written by run_all.sh (or any bench_*.py) and print markdown tables.

    python3 summarize.py results/*.jsonl

For every timed measurement (a dict with "per_run") it pools the runs of all invocations and prints
the median and the best (max calls/s, min latency) with the run count. For every scalar series
(a dict with "runs": [...]) it prints median / min / max over all pooled values.
Needs only the standard library.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def walk(node, path, timed, scalars):
    if isinstance(node, dict):
        if "per_run" in node and isinstance(node["per_run"], list):
            timed[path].extend(node["per_run"])
            return
        if isinstance(node.get("runs"), list) and "median" in node:
            scalars[path].extend(node["runs"])
            return
        for k, v in node.items():
            if k in ("versions", "machine"):
                continue
            walk(v, f"{path}.{k}" if path else k, timed, scalars)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        scalars[path].append(node)


def fmt(v, nd=1):
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def main(paths: list[str]) -> None:
    timed: dict = defaultdict(list)
    scalars: dict = defaultdict(list)
    versions = {}
    loads = []
    invocations = defaultdict(int)
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                d = json.loads(line)
                b = d.get("bench", "?")
                invocations[b] += 1
                versions.update(d.get("versions", {}))
                m = d.get("machine", {})
                loads.append((b, m.get("loadavg_at_start"), m.get("loadavg_at_end")))
                walk(d, b, timed, scalars)
    print("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    print("invocations: " + ", ".join(f"{k} x{v}" for k, v in invocations.items()))
    l1 = [x[1][0] for x in loads if x[1]] + [x[2][0] for x in loads if x[2]]
    if l1:
        print(
            f"1-min loadavg seen at script start/end: min {min(l1):.2f} median {statistics.median(l1):.2f} "
            f"max {max(l1):.2f} (2 cores)"
        )
    print()
    print(
        "| measurement | runs | calls/s median (best) | p50 us median (best) | p99 us median (best) "
        "| client CPU us/call | server CPU us/call |"
    )
    print("|---|---|---|---|---|---|---|")
    for path, runs in timed.items():

        def col(key, best):
            vals = [r[key] for r in runs if r.get(key) is not None]
            if not vals:
                return "-"
            return f"{fmt(statistics.median(vals))} ({fmt(best(vals))})"

        def med(key):
            vals = [r[key] for r in runs if r.get(key) is not None]
            return fmt(statistics.median(vals)) if vals else "-"

        print(
            f"| {path} | {len(runs)} | {col('calls_per_s', max)} | {col('p50_us', min)} | "
            f"{col('p99_us', min)} | {med('client_cpu_us_per_call')} | {med('server_cpu_us_per_call')} |"
        )
    print()
    print("| scalar | n | median | min | max |")
    print("|---|---|---|---|---|")
    for path, vals in scalars.items():
        if path.endswith(
            (
                ".runs",
                ".repeats",
                "n_calls",
                "n_lists",
                "n_seq",
                "n_conc",
                "concurrency",
                "cold_runs",
                "n_tools",
                "n_seq_http",
                "n_conc_http",
                "big_runs",
            )
        ):
            continue
        if "per_run" in path or path.endswith("elapsed_s"):
            continue
        print(
            f"| {path} | {len(vals)} | {fmt(statistics.median(vals), 3)} | {fmt(min(vals), 3)} | "
            f"{fmt(max(vals), 3)} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
