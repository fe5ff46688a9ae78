#!/usr/bin/python3
"""Compare a tessera run with reference_gpt.py: per-step losses and final parameters.

Usage:
  compare_parity.py --metrics RUN/metrics.jsonl --losses losses.json
                    --checkpoint tessera_final.h5 --reference FINAL.h5
                    [--loss-rtol 1e-5] [--param-tol 1e-4] [--first-step K]

metrics.jsonl holds one JSON object per line; the lines with "type": "train" carry "step" (the
1-based step just completed) and "loss". A step logged twice (a rolled-back or resumed run that
repeated it) counts once, with its last value. With --first-step K, steps before K are ignored
(for a run directory that also holds the steps before the checkpoint the reference started
from). The i-th remaining step is compared with the i-th loss in losses.json:
|tessera - reference| <= loss_rtol * |reference|. Every tensor /model/<name> of the two files
must exist in both with the same shape and satisfy max|a - b| <= param_tol * max|b|
(b = reference).

Prints a table of both and exits 0 when everything passes, 1 when anything fails (different
step counts, a missing tensor, a value out of tolerance), 2 on malformed input.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data",)]
from tessera_data import EXIT_IO, ToolError, open_h5, run_tool  # noqa: E402


def read_metrics(path, first_step):
    """{step: loss} of the train lines in a metrics.jsonl file."""
    try:
        with open(path) as fh:
            lines = fh.readlines()
    except OSError as e:
        raise ToolError(f"{path}: cannot read ({e.strerror})", EXIT_IO) from None
    losses = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            # A run killed mid-write may leave a torn last line; anything else is corruption.
            if no == len(lines) and not line.endswith("\n"):
                print(f"compare_parity: {path}:{no}: ignoring the incomplete last line", file=sys.stderr)
                continue
            raise ToolError(f"{path}:{no}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or rec.get("type") != "train":
            continue
        step, loss = rec.get("step"), rec.get("loss")
        if not isinstance(step, int) or not isinstance(loss, (int, float)):
            raise ToolError(f"{path}:{no}: a train line needs an integer 'step' and a numeric 'loss'")
        if first_step is None or step >= first_step:
            losses[step] = float(loss)
    return losses


def read_losses(path):
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as e:
        raise ToolError(f"{path}: cannot read ({e.strerror})", EXIT_IO) from None
    except json.JSONDecodeError as e:
        raise ToolError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, list) or not all(isinstance(v, (int, float)) for v in data):
        raise ToolError(f"{path}: expected a JSON list of numbers")
    return [float(v) for v in data]


def read_model(path):
    """{name: float64 array} of every dataset under /model."""
    with open_h5(path) as f:
        if "model" not in f:
            raise ToolError(f"{path}: no /model group")
        out = {}

        def visit(name, obj):
            if hasattr(obj, "shape"):
                out[name] = np.asarray(obj[...], dtype=np.float64)

        f["model"].visititems(visit)
    return out


def compare_losses(tessera, reference, rtol):
    """Prints the loss table; returns the number of failures."""
    steps = sorted(tessera)
    fails = 0
    if len(steps) != len(reference):
        print(f"FAIL step count: tessera logged {len(steps)} train steps, the reference ran "
              f"{len(reference)} (is log.every 1?)")
        fails += 1
    if steps and steps != list(range(steps[0], steps[0] + len(steps))):
        print(f"FAIL tessera's train steps are not consecutive: {steps}")
        fails += 1
    print(f"{'step':>6} {'tessera':>14} {'reference':>14} {'rel diff':>10}")
    for step, ref in zip(steps, reference):
        got = tessera[step]
        rel = abs(got - ref) / abs(ref) if ref != 0 else abs(got - ref)
        ok = math.isfinite(got) and math.isfinite(ref) and rel <= rtol
        fails += not ok
        print(f"{step:>6} {got:>14.8f} {ref:>14.8f} {rel:>10.2e}{'' if ok else '  FAIL'}")
    return fails


def compare_params(tessera, reference, tol):
    """Prints the per-tensor table; returns the number of failures."""
    fails = 0
    names = sorted(set(tessera) | set(reference))
    width = max([len(n) for n in names] + [6])
    print(f"{'tensor':<{width}} {'max diff':>10} {'bound':>10}")
    for name in names:
        if name not in tessera or name not in reference:
            where = "the tessera checkpoint" if name not in tessera else "the reference"
            print(f"{name:<{width}} missing from {where}  FAIL")
            fails += 1
            continue
        a, b = tessera[name], reference[name]
        if a.shape != b.shape:
            print(f"{name:<{width}} shape {a.shape} vs reference {b.shape}  FAIL")
            fails += 1
            continue
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        bound = tol * (float(np.max(np.abs(b))) if b.size else 0.0)
        ok = math.isfinite(diff) and diff <= bound
        fails += not ok
        print(f"{name:<{width}} {diff:>10.3e} {bound:>10.3e}{'' if ok else '  FAIL'}")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", required=True, help="tessera's RUN/metrics.jsonl")
    ap.add_argument("--losses", required=True, help="reference_gpt.py --losses-out file")
    ap.add_argument("--checkpoint", required=True, help="tessera's final checkpoint")
    ap.add_argument("--reference", required=True, help="reference_gpt.py --out file")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--param-tol", type=float, default=1e-4)
    ap.add_argument("--first-step", type=int, default=None,
                    help="ignore tessera's train lines before this step")
    args = ap.parse_args()

    tessera_losses = read_metrics(args.metrics, args.first_step)
    reference_losses = read_losses(args.losses)
    tessera_params = read_model(args.checkpoint)
    reference_params = read_model(args.reference)

    fails = compare_losses(tessera_losses, reference_losses, args.loss_rtol)
    print()
    fails += compare_params(tessera_params, reference_params, args.param_tol)
    print()
    if fails or not reference_losses:
        print(f"parity: FAIL ({fails} failures)" if fails else "parity: FAIL (no steps to compare)")
        return 1
    print(f"parity: PASS ({len(reference_losses)} steps, {len(reference_params)} tensors)")
    return 0


if __name__ == "__main__":
    run_tool(main)
