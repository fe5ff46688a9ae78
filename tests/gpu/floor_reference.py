#!/usr/bin/python3
"""A float64 reference run's parameters as a tessera checkpoint (tests/gpu/floor_refs.sh):

  floor_reference.py --init STEP0.h5 --model F64.h5 --out REF.h5

STEP0.h5 is the tessera checkpoint the reference started from, F64.h5 the reference's final
parameters as /model/<name> (tools/reference/reference_gpt.py --out: float32, canonical shapes).
REF.h5 is STEP0.h5 with every /model tensor replaced by F64.h5's and its checksum renewed, so that
`tessera ckpt diff REF.h5 RUN.h5` compares a run with the reference on a machine whose Python has
no HDF5 module (tests/gpu/fp32_floor.py). Written to REF.h5.tmp and renamed.

Exit status: 0 done, 2 bad input, 1 I/O error.
"""
import argparse
import os
import shutil
import sys

import numpy as np

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path[:0] = [os.path.join(TOOLS, d) for d in ("data", "interop")]
from tessera_ckpt import checksum  # noqa: E402
from tessera_data import ToolError, open_h5, run_tool  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", required=True, help="the step-0 tessera checkpoint")
    ap.add_argument("--model", required=True, help="the reference's /model/<name> (float32)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import h5py

    with open_h5(args.model) as f:
        if "model" not in f:
            raise ToolError(f"{args.model}: no /model group")
        ref = {}
        f["model"].visititems(lambda n, o: ref.__setitem__(n, np.asarray(o[...], np.float32))
                              if hasattr(o, "shape") else None)
    tmp = args.out + ".tmp"
    shutil.copyfile(args.init, tmp)
    try:
        with h5py.File(tmp, "r+") as f:
            names = []
            f["model"].visititems(lambda n, o: names.append(n) if hasattr(o, "shape") else None)
            if sorted(names) != sorted(ref):
                raise ToolError(f"{args.model}: tensors {sorted(set(names) ^ set(ref))} differ "
                                f"from {args.init}'s")
            for n in names:
                if f["model"][n].shape != ref[n].shape:
                    raise ToolError(f"{args.model}: {n} is {list(ref[n].shape)}, {args.init} "
                                    f"has {list(f['model'][n].shape)}")
                f["model"][n][...] = ref[n]
                f["checksum/model/" + n][()] = np.uint64(checksum(ref[n]))
        os.replace(tmp, args.out)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    print(f"floor_reference: {len(ref)} tensors of {args.model} into {args.out}")
    return 0


if __name__ == "__main__":
    run_tool(main)
