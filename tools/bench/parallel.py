#!/usr/bin/python3
"""The parallel half of `make bench`: per-rank memory and communication of a 3D layout against
the formulas (tools/reference/parallel_counts.py), the measured pipeline bubble against (pp-1)/(m+pp-1)
and, interleaved, (pp-1)/(v*m+pp-1), activation memory under recompute and sequence parallelism
(measured against the formula, with recompute's step time), data-parallel throughput (dp=2
against dp=1) on this machine, and `tessera plan`'s predicted step time on the measured `cpu`
machine against the measured one. Prints markdown tables; --only runs some sections (1-6).

  tools/bench/parallel.py --tessera bin/tessera --data data/default --out build/bench [--only 3,4]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import yaml

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("reference",)]
from parallel_counts import counts  # noqa: E402


def train(args, name, np_, threads, overrides):
    run_dir = os.path.join(args.out, name)
    subprocess.run(["rm", "-rf", run_dir], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               MPIR_CVAR_POLLS_BEFORE_YIELD=os.environ.get("MPIR_CVAR_POLLS_BEFORE_YIELD", "1"))
    cmd = ["mpiexec", "-n", str(np_), args.tessera, "train", args.deck, f"run.dir={run_dir}",
           f"data.train={args.data}/train.h5", "data.val=", "checkpoint.every=1000000",
           "log.every=1", "log.peak_gflops=1"] + overrides
    with open(run_dir + ".log", "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    deck = yaml.safe_load(open(os.path.join(run_dir, "deck.yaml")))
    return rows, deck


def cpu_share(n):
    """CPU time over wall time of n busy processes for 2 s each: the share of a core the load leaves."""
    spin = "import time\nt=time.monotonic()\nwhile time.monotonic()-t<2: pass\nprint(time.process_time()/(time.monotonic()-t))"
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    return min(1.0, statistics.mean(float(p.communicate()[0]) for p in procs))


def mb(x):
    return f"{x / 1e6:.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated section numbers to run (all)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    args.deck = os.path.join(args.out, "parallel.yaml")
    with open(args.deck, "w") as f:
        f.write("model: {n_layer: 4, n_head: 4, n_embd: 128, block_size: 128}\n"
                "data: {train: x, seq_len: 128}\n"
                "train: {steps: 6, batch_size: 16, micro_batch: 2}\n"
                "checkpoint: {restart: none}\n")
    out = []
    want = lambda n: not args.only or str(n) in args.only.split(",")  # noqa: E731

    if want(1):
        # 1. Memory and communication of every rank of (2,2,2).
        rows, deck = train(args, "layout222", 8, 1, ["parallel.dp=2", "parallel.tp=2", "parallel.pp=2",
                                                     "train.steps=3"])
        out.append("## Per-rank memory and communication, (dp,tp,pp) = (2,2,2), 8 ranks\n")
        out.append("GPT-2 shape L=4, H=4, C=128, T=128, vocab 257; batch 16, micro-batch 2 (2 per dp rank). "
                   "Memory in MB measured (tessera's allocations) / formula; communication is the payload "
                   "handed to MPI per step, MB measured / formula (FORMULAS.md), and the ring volume it "
                   "implies (all-reduce 2(n-1)/n).\n")
        out.append("| rank | (dp,tp,pp) | params | grads | Adam m,v | activations (all slots) | "
                   "layers' activations, formula / Korthikanti | tp | dp | pp | embed |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in (x for x in rows if x["type"] == "rank"):
            c = counts(deck, 2, 2, 2, 257, int(r["dp_rank"]), int(r["tp_rank"]), int(r["pp_rank"]))
            L_here = 2
            slots = min(2 - int(r["pp_rank"]), c["micro_batches"])
            layer_acts = slots * L_here * c["activation_bytes_per_layer_mb"]
            korth = slots * L_here * c["korthikanti_bytes_per_layer_mb"]
            ring = lambda key, n: r[key] * (2 * (n - 1) / n)  # noqa: E731
            out.append(
                f"| {r['rank']} | ({int(r['dp_rank'])},{int(r['tp_rank'])},{int(r['pp_rank'])}) "
                f"| {mb(r['param_bytes'])} / {mb(c['param_bytes'])} | {mb(r['grad_bytes'])} / {mb(c['grad_bytes'])} "
                f"| {mb(r['optim_bytes'])} / {mb(c['optim_bytes'])} | {mb(r['activation_bytes'])} "
                f"| {mb(layer_acts)} / {mb(korth)} "
                f"| {mb(r['tp_bytes_per_step'])} / {mb(c['tp_bytes_per_step'])} (ring {mb(ring('tp_bytes_per_step', 2))}) "
                f"| {mb(r['dp_bytes_per_step'])} / {mb(c['dp_bytes_per_step'])} (ring {mb(ring('dp_bytes_per_step', 2))}) "
                f"| {mb(r['pp_bytes_per_step'])} / {mb(c['pp_bytes_per_step'])} "
                f"| {mb(r['embed_bytes_per_step'])} / {mb(c['embed_bytes_per_step'])} |")

    if want(2):
        # 2. Pipeline bubble: 2 stages on 2 ranks (one core each), m = 2, 4, 8 micro-batches.
        out.append("\n## Pipeline bubble, pp = 2 on 2 ranks (1F1B)\n")
        out.append("Idle fraction of each stage: time blocked in receives over the step's pipeline time, "
                   "steps 2-6, against (pp-1)/(m+pp-1).\n")
        out.append("| micro-batches m | stage 0 measured | stage 1 measured | formula |")
        out.append("|---|---|---|---|")
        for m in (2, 4, 8):
            rows, deck = train(args, f"bubble{m}", 2, 1, ["parallel.pp=2", f"train.micro_batch={16 // m}"])
            stages = {int(r["pp_rank"]): r["pipeline_bubble"] for r in rows if r["type"] == "rank"}
            out.append(f"| {m} | {stages[0]:.3f} | {stages[1]:.3f} | {1 / (m + 1):.3f} |")

    if want(3):
        # 3. The interleaved schedule's bubble: 2 stages of 2 chunks on 2 ranks.
        out.append("\n## Interleaved 1F1B bubble, pp = 2, virtual_stages = 2 on 2 ranks\n")
        out.append("Measured as above, against (pp-1)/(v*m+pp-1).\n")
        out.append("| micro-batches m | stage 0 measured | stage 1 measured | formula |")
        out.append("|---|---|---|---|")
        for m in (2, 4, 8):
            rows, deck = train(args, f"bubble_v2_{m}", 2, 1, ["parallel.pp=2", "parallel.virtual_stages=2",
                                                              f"train.micro_batch={16 // m}"])
            stages = {int(r["pp_rank"]): r["pipeline_bubble"] for r in rows if r["type"] == "rank"}
            out.append(f"| {m} | {stages[0]:.3f} | {stages[1]:.3f} | {1 / (2 * m + 1):.3f} |")

    if want(4):
        # 4. Activation memory under recompute and sequence parallelism, and recompute's step time.
        out.append("\n## Activation memory: recompute and sequence parallelism, tp = 2 on 2 ranks\n")
        out.append("Rank 0's activation bytes (every slot and the recompute workspace) measured from "
                   "tessera's allocation / the formula (tools/reference/parallel_counts.py), one micro-batch of "
                   "2 x 128 tokens, fp32; and the median step time of steps 2-3 (1 thread per rank), "
                   "relative to no recompute without sequence parallelism.\n")
        out.append("| model | recompute | sequence parallel | activations MB (measured / formula) | "
                   "step ms | step time vs none |")
        out.append("|---|---|---|---|---|---|")
        shapes = {
            "llama-tiny (L=4, C=64, 4 heads, 2 kv heads)":
                ["model.arch=llama", "model.n_layer=4", "model.n_head=4", "model.n_kv_head=2",
                 "model.n_embd=64", "model.ffn_multiple=32"],
            "GPT-2 124M shape (L=12, C=768, 12 heads)":
                ["model.n_layer=12", "model.n_head=12", "model.n_embd=768"],
        }
        for name, shape in shapes.items():
            base = None
            for sp in ("false", "true"):
                for mode in ("none", "selective", "full"):
                    rows, deck = train(args, f"recompute_{mode}_{sp}_{len(shape)}", 2, 1,
                                       shape + ["parallel.tp=2", f"parallel.sequence_parallel={sp}",
                                                f"train.recompute={mode}", "train.batch_size=2",
                                                "train.micro_batch=2", "train.steps=3"])
                    r0 = next(r for r in rows if r["type"] == "rank" and int(r["rank"]) == 0)
                    c = counts(deck, 1, 2, 1, 257, 0, 0, 0)
                    ms = statistics.median(r["ms"] for r in rows if r["type"] == "train" and r["step"] > 1)
                    base = base or ms
                    out.append(f"| {name} | {mode} | {sp} | {mb(r0['activation_bytes'])} / "
                               f"{mb(c['activation_bytes'])} | {ms:.0f} | {ms / base:.2f}x |")

    if want(5):
        # 5. Data-parallel throughput on this machine's 2 cores.
        out.append("\n## Data parallel throughput, 2 cores\n")
        out.append("| layout | ranks x threads | tokens/s (median of steps 2-6) |")
        out.append("|---|---|---|")
        tps = {}
        for dp, threads in ((1, 2), (2, 1)):
            rows, _ = train(args, f"dp{dp}", dp, threads, [f"parallel.dp={dp}", "train.micro_batch=0"])
            tps[dp] = statistics.median(r["tokens_per_s"] for r in rows if r["type"] == "train" and r["step"] > 1)
            out.append(f"| dp={dp} | {dp} x {threads} | {tps[dp]:.0f} |")
        out.append(f"\ndp=2 / dp=1 throughput: {tps[2] / tps[1]:.2f}x on the same 2 cores (the ideal is 1.0: "
                   "both use both cores; the difference is what the gradient all-reduce and two half-size "
                   "problems cost or save).")
    if want(6):
        # 6. `tessera plan`'s step time for the `cpu` machine against the trainer's, GPT-2 124M
        # shape; each plan is made just before its run, on the run's threads, so both see the
        # same load. Needs the GPT-2-vocabulary token file tools/bench/all.sh writes.
        tokens = os.path.join(args.out, "tokens.h5")
        if not os.path.exists(tokens):
            sys.exit(f"tools/bench/parallel.py: {tokens}: missing (tools/bench/all.sh writes it)")
        shape = ["model.n_layer=12", "model.n_head=12", "model.n_embd=768", "model.vocab_size=50257",
                 "model.block_size=64", "data.seq_len=64", "train.batch_size=4", f"data.train={tokens}",
                 "train.steps=6"]
        out.append("\n## Predicted (`tessera plan`, machine `cpu`) against measured step time\n")
        out.append("GPT-2 124M shape (L=12, H=12, C=768, V=50257), T=64, batch 4, fp32, on this machine's "
                   "2 cores (shared with other work: the 1-minute load average is given before each run). "
                   "Measured: the median of steps 3-6 (steps 1 and 2 still fault in memory and warm the "
                   "caches). Predicted: `tessera plan --json` run just "
                   "before, with the run's threads; it times this machine's sgemm at each of the step's "
                   "GEMM shapes, its exp rate and copy bandwidth (src/plan/step_time.cpp).\n")
        out.append("The CPU share is what the load leaves a run: as many busy processes as the run has "
                   "threads, each 2 s, their CPU time over wall time, just before and just after the run "
                   "(averaged). The last column scales the measured step by it, an estimate of the step "
                   "on a quiet machine.\n")
        out.append("| layout | ranks x threads | load | predicted s | measured s | predicted / measured | "
                   "CPU share | predicted / (measured x share) |")
        out.append("|---|---|---|---|---|---|---|---|")
        for name, np_, threads, extra in (
                ("1 rank", 1, 2, []),
                ("dp=2", 2, 1, ["parallel.dp=2"]),
                ("tp=2", 2, 1, ["parallel.tp=2"]),
                ("pp=2, m=4", 2, 1, ["parallel.pp=2", "train.micro_batch=1"])):
            load = os.getloadavg()[0]
            deck_args = shape + extra + [f"device.threads={threads}"]
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            plan = json.loads(subprocess.run(
                [args.tessera, "plan", args.deck, "--ranks", str(np_), "--machine", "cpu", "--json"] + deck_args,
                env=env, check=True, capture_output=True, text=True).stdout)
            before = cpu_share(np_ * threads)
            rows, _ = train(args, f"predict_{np_}_{'_'.join(extra) or 'one'}", np_, threads, deck_args)
            share = (before + cpu_share(np_ * threads)) / 2
            step = statistics.median(r["ms"] for r in rows if r["type"] == "train" and r["step"] > 2) / 1000
            predicted = plan["step_seconds"]
            out.append(f"| {name} | {np_} x {threads} | {load:.1f} | {predicted:.2f} | {step:.2f} | "
                       f"{predicted / step:.2f} | {share:.2f} | {predicted / (step * share):.2f} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
