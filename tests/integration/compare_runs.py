#!/usr/bin/python3
"""Compares tessera runs with a reference run: every logged training loss (relative tolerance)
and every /model tensor of a checkpoint (max |a - b| <= tol * max |reference|).

  compare_runs.py REF_METRICS REF_CKPT OTHER_METRICS OTHER_CKPT [--loss-rtol 1e-5]
                  [--param-tol 1e-4 | --param-norm-tol 1e-2] [--steps FIRST:LAST] [--exact]

Prints one line with the worst relative loss difference and the worst tensor; exit 0 when all
pass, 1 otherwise. --exact demands bit equality of losses and of every dataset (same layout).
--param-norm-tol compares the model as a whole instead of tensor by tensor: ||a - b|| / ||ref||
over every /model value (for bf16 runs, whose rounding moves a small tensor's elements by a
large part of its largest).

The tensors are compared by `tessera ckpt diff` (the binary in $TESSERA, else bin/tessera), so
this script needs nothing but Python's standard library: the GPU bundle runs it on nodes whose
Python has no HDF5 module.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def losses(path, first, last):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r["type"] == "train" and first <= r["step"] <= last:
            out[r["step"]] = r["loss"]   # a restart may log a step again: the last one counts
    return out


def tensor_diffs(ref_ckpt, ckpt):
    """{name: None (missing), "shape", or (max_ref, max_diff, sum_ref2, sum_diff2, identical)}"""
    binary = os.environ.get("TESSERA") or os.path.join(ROOT, "bin", "tessera")
    run = subprocess.run([binary, "ckpt", "diff", ref_ckpt, ckpt], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"compare_runs: tessera ckpt diff failed: {run.stderr.strip()}")
    out = {}
    for line in run.stdout.splitlines():
        f = line.split("\t")
        if f[1] == "missing":
            out[f[0]] = None
        elif f[1] == "shape":
            out[f[0]] = "shape"
        else:
            out[f[0]] = tuple(float(x) for x in f[1:5]) + (f[5] == "1",)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref_metrics"), ap.add_argument("ref_ckpt")
    ap.add_argument("metrics"), ap.add_argument("ckpt")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--param-tol", type=float, default=1e-4)
    ap.add_argument("--param-norm-tol", type=float, default=None)
    ap.add_argument("--steps", default="1:1000000")
    ap.add_argument("--exact", action="store_true")
    a = ap.parse_args()
    first, last = map(int, a.steps.split(":"))
    ref, got = losses(a.ref_metrics, first, last), losses(a.metrics, first, last)
    problems = []
    if sorted(ref) != sorted(got) or not ref:
        problems.append(f"steps differ: reference {sorted(ref)}, run {sorted(got)}")
    worst_loss = 0.0
    for s in sorted(set(ref) & set(got)):
        d = abs(got[s] - ref[s]) / abs(ref[s])
        worst_loss = max(worst_loss, d)
        if (a.exact and got[s] != ref[s]) or d > a.loss_rtol:
            problems.append(f"step {s}: loss {got[s]!r} vs {ref[s]!r} (rel {d:.2e})")
    worst_param, worst_name = 0.0, ""
    diff2 = ref2 = 0.0
    groups = ("model/", "optim/") if a.exact else ("model/",)
    for n, t in tensor_diffs(a.ref_ckpt, a.ckpt).items():
        if not n.startswith(groups):
            continue
        if t is None:
            problems.append(f"missing {n}")
            continue
        if t == "shape":
            problems.append(f"{n}: shapes differ")
            continue
        max_ref, max_diff, sum_ref2, sum_diff2, identical = t
        if a.exact:
            if not identical:
                problems.append(f"{n} differs")
            continue
        d = max_diff / (max_ref or 1.0)
        diff2 += sum_diff2
        ref2 += sum_ref2
        if d > worst_param:
            worst_param, worst_name = d, n
        if a.param_norm_tol is None and d > a.param_tol:
            problems.append(f"{n}: max diff {d:.2e} of max |value|")
    norm = (diff2 / ref2) ** 0.5 if ref2 > 0 else 0.0
    if a.param_norm_tol is not None and norm > a.param_norm_tol:
        problems.append(f"parameters: ||diff|| / ||reference|| = {norm:.2e}")
    print(f"{len(ref)} steps, worst loss rel diff {worst_loss:.2e}, worst tensor {worst_name} "
          f"{worst_param:.2e}, parameters' relative distance {norm:.2e}"
          + ("" if not problems else "; " + "; ".join(problems[:5])))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
