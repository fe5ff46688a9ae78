#!/usr/bin/python3
"""Two fp8 runs' amax histories (/train/fp8_amax_history of their checkpoints), entry by entry:

  compare_amax.py REF.h5 RUN.h5 --rtol R

The first step's amaxes (the oldest entry of each history; -1 where no step has been, and both
must agree there), every layer's input, weight and output gradient, must lie within a relative R
of the reference's: at that step both runs hold the same parameters and see the same tokens, so
their amaxes differ only by the runs' arithmetic (bf16 activations against the CPU's fp32: 1.7%
on the inputs, 3.7% on the gradients of test_trainer.sh's fp8 runs in the emulator). The training
comparisons' loss and parameter bounds (bf16's 2e-2) do not see an amax that is wrong by a
micro-batch's worth (a cast keeping only its own amax instead of the step's largest: 13% on the
inputs and 22% on the gradients at the first step there): the scales move a little and the
losses with them, well inside those bounds. The later steps' differences (the runs' parameters
drift apart: up to 5% and 12%) are printed, not judged. An MoE model's rows after the layers' and
the head's, its experts' (per MoE layer and GEMM the dispatched rows' input and output gradient,
then each expert's weight), are judged alike and counted under their kinds. Prints one line;
exit 0 within R, 1 beyond it, 2 on bad input (h5py needed).
"""
import argparse
import sys

import numpy as np

KINDS = ("input", "weight", "output gradient")  # a layer's rows, in model/fp8.hpp's order

try:
    import h5py
except ImportError:
    h5py = None


def history(path):
    """The histories, and each row's kind (an index into KINDS)."""
    with h5py.File(path, "r") as f:
        if "train/fp8_amax_history" not in f:
            raise KeyError(f"{path}: no /train/fp8_amax_history (not an fp8 run's checkpoint?)")
        h = np.asarray(f["train/fp8_amax_history"][...], dtype=np.float64)
        model = f["model"].attrs if "model" in f else {}
        layers = int(model.get("n_layer", 0)) * 12 + 3
        experts = int(model.get("moe_experts", 0))
    kind = np.arange(len(h)) % 3
    if layers < len(h) and experts > 0:  # per GEMM: input, output gradient, each expert's weight
        j = (np.arange(len(h) - layers)) % (2 + experts)
        kind[layers:] = np.where(j == 0, 0, np.where(j == 1, 2, 1))
    return h, kind


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--rtol", type=float, required=True)
    a = ap.parse_args()
    if h5py is None:
        print("compare_amax: no h5py in this Python", file=sys.stderr)
        return 2
    try:
        (ref, kind), (run, _) = history(a.ref), history(a.run)
    except (OSError, KeyError) as e:
        print(f"compare_amax: {e}", file=sys.stderr)
        return 2
    if ref.shape != run.shape:
        print(f"compare_amax: histories of shapes {ref.shape} and {run.shape}", file=sys.stderr)
        return 2
    empty = ref < 0
    if not np.array_equal(empty, run < 0):
        print("amax histories: the runs' histories hold different steps")
        return 1
    rel = np.where(empty, 0.0, np.abs(run - ref) / np.maximum(np.abs(ref), 1e-30))
    steps = int((~empty[0]).sum())
    if steps == 0:
        print("amax histories: no step recorded")
        return 1
    first = rel[:, steps - 1]  # newest first: the oldest entry is the first step's
    worst = float(first.max())
    later = ", ".join(f"{k} {float(rel[kind == i].max()):.2e}" for i, k in enumerate(KINDS))
    print(f"amax histories: the first step's worst relative difference {worst:.2e} (tolerance "
          f"{a.rtol:g}; " + ", ".join(f"{k} {float(first[kind == i].max()):.2e}"
                                      for i, k in enumerate(KINDS)) +
          f"); over all {steps} steps: {later}")
    return 0 if worst <= a.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
