#!/usr/bin/python3
"""The fp32 tolerance of the CUDA-vs-CPU training comparisons, derived instead of guessed.

  fp32_floor.py --reference REF.h5 --losses F64.json --floor RUN_DIR --run RUN_DIR
                --step N [--factor 8]

Both tessera runs (RUN_DIR/metrics.jsonl and RUN_DIR/checkpoints/step_N.h5) are measured against
a float64 run of the same training from the same step-0 checkpoint (tests/gpu/floor_refs.sh:
tools/reference/reference_gpt.py --dtype float64; REF.h5 its final parameters as a tessera
checkpoint, F64.json its losses): the worst relative loss error over the steps, and the worst
tensor error relative to the tensor's largest magnitude. The CPU's fp32 run (--floor) is what fp32
arithmetic costs; the run under test (--run, the CUDA backend) passes when each of its errors is
within `factor` times the floor's (the floor taken no smaller than fp32's unit round-off, 2^-24):
a right kernel sums in another order and lands near the truth as the CPU does; a wrong one lands
far from both.

The tensors are compared by `tessera ckpt diff` (the binary in $TESSERA, else bin/tessera): this
script needs nothing but Python's standard library, so it runs on a GPU node whose Python has no
HDF5 module or numpy.

Prints one line; exit 0 when it passes, 1 when not, 2 on bad input.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT_ROUNDOFF = 2.0 ** -24


class BadInput(Exception):
    pass


def read_losses(path):
    """The float64 run's losses: a JSON list of numbers."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: {e}") from None
    if not isinstance(data, list) or not all(isinstance(v, (int, float)) for v in data):
        raise BadInput(f"{path}: expected a JSON list of numbers")
    return [float(v) for v in data]


def read_metrics(path):
    """{step: loss} of the train lines of a metrics.jsonl (a restart's repeat: the last counts)."""
    losses = {}
    try:
        with open(path) as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    if rec.get("type") == "train":
                        losses[int(rec["step"])] = float(rec["loss"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"{path}: {e}") from None
    return losses


def tensor_errors(reference, ckpt):
    """{name: max |run - ref| / max |ref|} over the reference's /model tensors."""
    binary = os.environ.get("TESSERA") or os.path.join(ROOT, "bin", "tessera")
    run = subprocess.run([binary, "ckpt", "diff", reference, ckpt], capture_output=True, text=True)
    if run.returncode != 0:
        raise BadInput(f"tessera ckpt diff {reference} {ckpt}: {run.stderr.strip()}")
    out = {}
    for line in run.stdout.splitlines():
        f = line.split("\t")
        if not f[0].startswith("model/"):
            continue
        if f[1] in ("missing", "shape"):
            raise BadInput(f"{ckpt}: {f[0]} {f[1]} (the reference has it)")
        max_ref, max_diff = float(f[1]), float(f[2])
        if max_ref > 0:
            out[f[0]] = max_diff / max_ref
    if not out:
        raise BadInput(f"{reference}: no /model tensors")
    return out


def errors(run_dir, step, ref_losses, reference):
    """(worst relative loss error, worst tensor error / the tensor's max |ref|, that tensor)."""
    losses = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    steps = sorted(losses)
    if len(steps) != len(ref_losses):
        raise BadInput(f"{run_dir}: {len(steps)} train steps logged, the reference ran "
                       f"{len(ref_losses)}")
    loss_err = max(abs(losses[s] - r) / abs(r) for s, r in zip(steps, ref_losses))
    tensors = tensor_errors(reference, os.path.join(run_dir, "checkpoints", f"step_{step:08d}.h5"))
    name = max(tensors, key=lambda n: tensors[n] if tensors[n] == tensors[n] else float("inf"))
    worst = tensors[name] if tensors[name] == tensors[name] else float("inf")  # NaN: infinitely off
    return loss_err, worst, name


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", required=True,
                    help="the float64 run's parameters, a tessera checkpoint")
    ap.add_argument("--losses", required=True, help="the float64 run's losses (JSON list)")
    ap.add_argument("--floor", required=True, help="the CPU fp32 run's directory")
    ap.add_argument("--run", required=True, help="the run under test's directory")
    ap.add_argument("--step", type=int, required=True, help="the checkpoint step compared")
    ap.add_argument("--factor", type=float, default=8.0)
    args = ap.parse_args()
    try:
        ref_losses = read_losses(args.losses)
        f_loss, f_param, _ = errors(args.floor, args.step, ref_losses, args.reference)
        r_loss, r_param, r_name = errors(args.run, args.step, ref_losses, args.reference)
    except BadInput as e:
        print(f"fp32_floor: {e}", file=sys.stderr)
        return 2
    loss_bound = args.factor * max(f_loss, UNIT_ROUNDOFF)
    param_bound = args.factor * max(f_param, UNIT_ROUNDOFF)
    ok = r_loss <= loss_bound and r_param <= param_bound
    print(f"vs float64: run's loss error {r_loss:.2e} (bound {loss_bound:.2e}), worst tensor "
          f"{r_name} {r_param:.2e} (bound {param_bound:.2e}); the CPU fp32 floor: loss "
          f"{f_loss:.2e}, tensors {f_param:.2e}; bound = {args.factor:g} x floor")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
