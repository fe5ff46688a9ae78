#!/usr/bin/python3
"""The fp32 tolerance of the CUDA-vs-CPU training comparisons, derived instead of guessed.

  fp32_floor.py --reference F64.h5 --losses F64.json --floor RUN_DIR --run RUN_DIR
                --step N [--factor 8]

Both tessera runs (RUN_DIR/metrics.jsonl and RUN_DIR/checkpoints/step_N.h5) are measured against
a float64 run of the same training (tools/reference/reference_gpt.py --dtype float64 from the same step-0
checkpoint): the worst relative loss error over the steps, and the worst tensor error relative to
the tensor's largest magnitude. The CPU's fp32 run (--floor) is what fp32 arithmetic costs; the
run under test (--run, the CUDA backend) passes when each of its errors is within `factor` times
the floor's (the floor taken no smaller than fp32's unit round-off, 2^-24): a right kernel sums
in another order and lands near the truth as the CPU does; a wrong one lands far from both.

Prints one line; exit 0 when it passes, 1 when not, 2 on bad input.
"""
import argparse
import os
import sys

import numpy as np

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path[:0] = [os.path.join(TOOLS, "data"), os.path.join(TOOLS, "reference")]
from compare_parity import read_losses, read_metrics, read_model  # noqa: E402
from tessera_data import ToolError, run_tool  # noqa: E402

UNIT_ROUNDOFF = 2.0 ** -24


def errors(run_dir, step, ref_losses, ref_model):
    """(worst relative loss error, worst tensor error / the tensor's max |ref|, that tensor)."""
    losses = read_metrics(os.path.join(run_dir, "metrics.jsonl"), None)
    steps = sorted(losses)
    if len(steps) != len(ref_losses):
        raise ToolError(f"{run_dir}: {len(steps)} train steps logged, the reference ran "
                        f"{len(ref_losses)}")
    loss_err = max(abs(losses[s] - r) / abs(r) for s, r in zip(steps, ref_losses))
    model = read_model(os.path.join(run_dir, "checkpoints", f"step_{step:08d}.h5"))
    if set(model) != set(ref_model):
        raise ToolError(f"{run_dir}: tensors differ from the reference's: "
                        f"{sorted(set(model) ^ set(ref_model))}")
    worst, name = 0.0, ""
    for n, b in ref_model.items():
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        if scale == 0.0:
            continue
        e = float(np.max(np.abs(model[n] - b))) / scale
        if not np.isfinite(e) or e > worst:
            worst, name = (e if np.isfinite(e) else float("inf")), n
    return loss_err, worst, name


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", required=True, help="the float64 run's parameters")
    ap.add_argument("--losses", required=True, help="the float64 run's losses (JSON list)")
    ap.add_argument("--floor", required=True, help="the CPU fp32 run's directory")
    ap.add_argument("--run", required=True, help="the run under test's directory")
    ap.add_argument("--step", type=int, required=True, help="the checkpoint step compared")
    ap.add_argument("--factor", type=float, default=8.0)
    args = ap.parse_args()
    ref_losses, ref_model = read_losses(args.losses), read_model(args.reference)
    f_loss, f_param, _ = errors(args.floor, args.step, ref_losses, ref_model)
    r_loss, r_param, r_name = errors(args.run, args.step, ref_losses, ref_model)
    loss_bound = args.factor * max(f_loss, UNIT_ROUNDOFF)
    param_bound = args.factor * max(f_param, UNIT_ROUNDOFF)
    ok = r_loss <= loss_bound and r_param <= param_bound
    print(f"vs float64: run's loss error {r_loss:.2e} (bound {loss_bound:.2e}), worst tensor "
          f"{r_name} {r_param:.2e} (bound {param_bound:.2e}); the CPU fp32 floor: loss "
          f"{f_loss:.2e}, tensors {f_param:.2e}; bound = {args.factor:g} x floor")
    return 0 if ok else 1


if __name__ == "__main__":
    run_tool(main)
