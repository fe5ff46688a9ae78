#!/usr/bin/python3
"""Where a step goes, predicted against measured: `tessera plan --json`'s breakdown_ms of a deck
beside the breakdown_ms a run of it logged (metrics.jsonl's train lines; the mean of those after
the first, which warms up), kind by kind (docs/running.md#step-breakdown).

Usage:
  tessera plan RUN_DIR/deck.yaml --ranks N --json > plan.json
  plan_vs_run.py RUN_DIR plan.json [--min-share 0.005]

Prints a Markdown table: kind, plan ms, run ms, run / plan, for each kind holding at least
--min-share of either step, then the steps. Exit status: 0 done, 2 bad input.
"""
import argparse
import json
import os
import sys


def run_breakdown(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "train" and isinstance(r.get("breakdown_ms"), dict):
                rows.append(r["breakdown_ms"])
    if len(rows) > 1:
        rows = rows[1:]
    if not rows:
        raise ValueError(f"{path}: no train line with a breakdown_ms (log.breakdown)")
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("plan_json")
    ap.add_argument("--min-share", type=float, default=0.005)
    a = ap.parse_args()
    try:
        run = run_breakdown(a.run_dir)
        with open(a.plan_json) as f:
            plan = json.load(f).get("breakdown_ms")
        if not isinstance(plan, dict):
            raise ValueError(f"{a.plan_json}: no breakdown_ms (a plan from before the breakdown?)")
    except (OSError, ValueError) as e:
        print(f"plan_vs_run: {e}", file=sys.stderr)
        return 2
    print("| kind | plan ms | run ms | run / plan |")
    print("|---|---|---|---|")
    for k in plan:
        if k == "step":
            continue
        p, r = plan[k], run.get(k, 0.0)
        if p < a.min_share * plan["step"] and r < a.min_share * run["step"]:
            continue
        ratio = f"{r / p:.2f}" if p > 0 else "-"
        print(f"| {k} | {p:.2f} | {r:.2f} | {ratio} |")
    print(f"| step | {plan['step']:.2f} | {run['step']:.2f} | {run['step'] / plan['step']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
