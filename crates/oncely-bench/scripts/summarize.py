#!/usr/bin/env python3
"""Summarizes the JSON lines of http.sh into the Markdown rows of docs/PERFORMANCE.md.

Usage: python3 crates/oncely-bench/scripts/summarize.py results.jsonl
For each store and round: the layer/baseline throughput ratio and the replay/first-execution
ratio are computed within the round (same noise), then the per-round values are listed and
their median reported.
"""
import json
import statistics
import sys
from collections import defaultdict

runs = defaultdict(dict)
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    runs[(r["store"], r["round"])][r["variant"]] = r["record"]

stores = []
for (store, _) in runs:
    if store not in stores:
        stores.append(store)

print("| store | baseline req/s | layer req/s | layer/baseline | replay req/s | replay/first | "
      "p99 baseline ms | p99 layer ms | p99 added ms | p99 replay ms | non-2xx or errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for store in stores:
    rounds = sorted(k[1] for k in runs if k[0] == store)
    rows = [runs[(store, n)] for n in rounds]
    def col(variant, f):
        return [f(r[variant]) for r in rows]
    rps = lambda rec: rec["requests_per_sec"]
    p99 = lambda rec: rec["latency_ms"]["p99"]
    bad = lambda rec: sum(v for k, v in rec["status"].items() if not k.startswith("2")) + sum(rec["errors"].values())
    base, layer, rep = col("baseline", rps), col("layer", rps), col("replay", rps)
    ratio = [l / b for l, b in zip(layer, base)]
    rratio = [r / l for r, l in zip(rep, layer)]
    pb, pl, pr = col("baseline", p99), col("layer", p99), col("replay", p99)
    added = [l - b for l, b in zip(pl, pb)]
    fmt = lambda xs, d=0: " / ".join(f"{x:.{d}f}" for x in xs) + (f" (med {statistics.median(xs):.{d}f})" if len(xs) > 1 else "")
    errs = sum(col("baseline", bad)) + sum(col("layer", bad)) + sum(col("replay", bad))
    print(f"| {store} | {fmt(base)} | {fmt(layer)} | {fmt(ratio, 2)} | {fmt(rep)} | {fmt(rratio, 2)} | "
          f"{fmt(pb, 2)} | {fmt(pl, 2)} | {fmt(added, 2)} | {fmt(pr, 2)} | {errs} |")
