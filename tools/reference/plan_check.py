#!/usr/bin/python3
"""Holds a run's per-rank report (the "rank" lines of metrics.jsonl) against `tessera plan --json`
of the same deck and layout: parameter, gradient, optimizer and activation bytes, the buffers that
hold them (master and copy, gradients, optimizer state, ZeRO's transient buffers) and the bytes per
step on each communicator must be equal (tests/integration/test_comm_volume.sh).

  plan_check.py METRICS.jsonl PLAN.json     exit 1 on any difference
"""
import json
import sys

KEYS = ("param_bytes", "grad_bytes", "optim_bytes", "activation_bytes", "tp_bytes_per_step",
        "dp_bytes_per_step", "pp_bytes_per_step", "embed_bytes_per_step", "param_buffer_bytes",
        "grad_buffer_bytes", "optimizer_buffer_bytes", "transient_bytes", "pipeline_buffer_bytes",
        "arena_bytes", "cp_bytes_per_step", "ep_bytes_per_step")


def main(metrics_path, plan_path):
    ranks = [r for r in map(json.loads, open(metrics_path)) if r["type"] == "rank"]
    plan = json.load(open(plan_path))
    roles = {(r["pp_rank"], r["tp_rank"]): r for r in plan["roles"]}
    bad = 0
    for r in ranks:
        want = roles[(int(r["pp_rank"]), int(r["tp_rank"]))]
        for key in KEYS:
            # (cp_ and ep_bytes_per_step: runs and plans from before context and expert
            # parallelism have none)
            if r.get(key, 0) != want.get(key, 0):
                print(f"rank {r['rank']}: {key} measured {r.get(key, 0):.0f}, plan "
                      f"{want.get(key, 0):.0f}")
                bad += 1
    print(f"{len(ranks)} ranks: {'all' if not bad else 'not all'} figures equal tessera plan's")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
