#!/usr/bin/env python3
"""Each CUDA kernel's registers, shared memory, stack and spills per architecture, from the
`ptxas -v` output the build keeps beside every object (build-report/src/backend/cuda/*.ptxas; the
toolkit's cuobjdump is not needed). Writes the table to --out and stdout; exits 1 when any kernel
spills to local memory (spill stores or loads > 0), 2 when there is nothing to report.

usage: cuda_report.py --out build/cuda-report.txt FILE.ptxas...
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
PROPS = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse(path):
    rows, entry, props_for = [], None, None
    for line in open(path, errors="replace"):
        m = ENTRY.search(line)
        if m:
            entry = {"file": os.path.basename(path).replace(".ptxas", ".cu"), "mangled": m.group(1),
                     "arch": m.group(2), "regs": 0, "smem": 0, "stack": 0, "spill_st": 0,
                     "spill_ld": 0}
            rows.append(entry)
            continue
        m = PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = FRAME.search(line)
        if m and entry is not None and props_for == entry["mangled"]:
            entry["stack"], entry["spill_st"], entry["spill_ld"] = map(int, m.groups())
            continue
        m = USED.search(line)
        if m and entry is not None:
            entry["regs"] = int(m.group(1))
            entry["smem"] = int(m.group(3) or 0)
    return rows


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    got = out.stdout.splitlines()
    return got if len(got) == len(names) else names


def short(name):
    # "void tessera::cuda::(anonymous namespace)::gelu_forward_kernel<float, 4>(float*, ...)"
    # -> "gelu_forward_kernel<float, 4>"
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    name = name.replace("tessera::cuda::", "").replace("__nv_bfloat16", "bf16")
    depth, end = 0, len(name)
    for i, ch in enumerate(name):  # cut the parameter list: the first '(' outside template args
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            end = i
            break
    return name[:end]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    rows = [r for f in args.files for r in parse(f)]
    if not rows:
        print("cuda-report: no kernels found in " + " ".join(args.files), file=sys.stderr)
        return 2
    for r, name in zip(rows, demangle([r["mangled"] for r in rows])):
        r["name"] = short(name)
    rows.sort(key=lambda r: (r["file"], r["name"], r["arch"]))
    head = ("file", "kernel", "arch", "regs", "smem B", "stack B", "spill st B", "spill ld B")
    table = [head] + [(r["file"], r["name"], r["arch"], r["regs"], r["smem"], r["stack"],
                       r["spill_st"], r["spill_ld"]) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) if i < 3 else str(v).rjust(w)
                       for i, (v, w) in enumerate(zip(row, widths))) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    spills = [r for r in rows if r["spill_st"] or r["spill_ld"]]
    archs = sorted({r["arch"] for r in rows})
    top = max(rows, key=lambda r: r["regs"])
    lines.append("")
    lines.append("%d kernels x %d architectures (%s); max registers %d (%s, %s); max smem %d B; "
                 "max stack %d B; spilling: %d" % (len(rows) // max(1, len(archs)), len(archs),
                                                   ", ".join(archs), top["regs"], top["name"],
                                                   top["arch"], max(r["smem"] for r in rows),
                                                   max(r["stack"] for r in rows), len(spills)))
    for r in spills:
        lines.append("SPILL: %s %s: %d B stored, %d B loaded" % (r["name"], r["arch"],
                                                                  r["spill_st"], r["spill_ld"]))
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    sys.stdout.write(text)
    print("cuda-report: wrote %s: %s" % (args.out, "FAIL: kernels spill" if spills else "no spills"))
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
