#!/usr/bin/env bash
# `make bench`: sgemm peak, tessera's training throughput on a GPT-2 124M shape, and the PyTorch
# reference's on the same shape, threads and batch, measured side by side in one run; the step
# against sgemm at two shapes with where its time goes (tools/bench/step.sh); then the
# parallel layouts (tools/bench/parallel.py), the ZeRO stages (tools/bench/zero.sh), context
# parallelism (tools/bench/cp.sh), FP8 convergence against fp32 (tools/bench/fp8.sh), the update
# rules' convergence side by side (tools/bench/optim.sh: AdamW, Adafactor), mixture of experts
# against dense and over ep (tools/bench/moe.sh), the
# checkpoint stall synchronous and asynchronous (tools/bench/checkpoint.sh), tokenizer encoding
# (tools/bench/tokenizer.sh), data preparation on 1, 2 and 4 ranks (tools/bench/data_prepare.sh),
# then the data loader (tools/bench/data.sh). Writes the tables to
# build/bench/results.md and
# prints them.
#   THREADS (2)  STEPS (6 timed steps after one warm-up)  PYTHON (/usr/bin/python3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-6}
OUT=$ROOT/build/bench
mkdir -p "$OUT"
export OMP_NUM_THREADS=$THREADS
L=12 H=12 C=768 V=50257 T=64 B=4

echo "bench: sgemm peak ($THREADS threads)" >&2
peak=$("$ROOT/bin/tessera" peak | awk '/sgemm_gflops/ {print $2}')

echo "bench: random GPT-2-vocabulary token file" >&2
"$PYTHON" "$ROOT/tools/data/random_tokens.py" "$OUT/tokens.h5" "$V"

echo "bench: tessera, GPT-2 124M shape, T=$T B=$B, $((STEPS + 1)) steps" >&2
rm -rf "$OUT/run"
cat >"$OUT/deck.yaml" <<DECK
model: {n_layer: $L, n_head: $H, n_embd: $C, block_size: $T, vocab_size: $V, vocab_multiple: 64}
data: {train: "$OUT/tokens.h5", seq_len: $T}
train: {steps: $((STEPS + 1)), batch_size: $B}
checkpoint: {every: 1000000, restart: none, dir: "$OUT/run/ckpt"}
log: {every: 1, peak_gflops: $peak}
run: {dir: "$OUT/run"}
device: {threads: $THREADS}
DECK
# The end-of-run checkpoint is part of a real run but not of the step rate: only steps are timed.
"$ROOT/bin/tessera" train "$OUT/deck.yaml" >"$OUT/tessera.log"
read -r tessera_tps tessera_mfu < <("$PYTHON" - "$OUT/run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l][1:]   # step 1 is the warm-up
print(statistics.median(r["tokens_per_s"] for r in rows), statistics.median(r["mfu"] for r in rows))
PY
)

echo "bench: PyTorch reference, same shape" >&2
torch_tps=$("$PYTHON" "$ROOT/tools/reference/reference_gpt.py" --bench --n-layer $L --n-head $H --n-embd $C \
  --vocab $V --seq $T --batch $B --steps "$STEPS" --threads "$THREADS" 2>"$OUT/torch.log" |
  awk '/tokens_per_second/ {print $2}')
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)')

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
"$PYTHON" - "$peak" "$tessera_tps" "$tessera_mfu" "$torch_tps" "$torch_version" "$cpu" "$THREADS" >"$OUT/results.md" <<'PY'
import sys
peak, tps, mfu, torch_tps = map(float, sys.argv[1:5])
version, cpu, threads = sys.argv[5:8]
print(f"# tessera bench ({cpu}, {threads} threads)\n")
print("| what | value |")
print("|---|---|")
print(f"| sgemm 1024^3, OpenBLAS | {peak:.1f} GFLOP/s |")
print(f"| tessera train, GPT-2 124M shape (T=64, B=4) | {tps:.0f} tokens/s, MFU {100 * mfu:.1f}% of sgemm peak |")
print(f"| PyTorch {version} reference, same shape | {torch_tps:.0f} tokens/s |")
print(f"| tessera / PyTorch | {tps / torch_tps:.2f}x (target >= 1.5x) |")
print("\nMFU counts 6*N_matmul + 12*L*C*T FLOPs per token (FORMULAS.md), against the sgemm rate above.")
PY
echo "bench: the step against sgemm at T=64 B=4 and T=1024 B=1, with its breakdown (tools/bench/step.sh)" >&2
{ echo; OUT=$OUT PYTHON=$PYTHON THREADS=$THREADS TOKENS=$OUT/tokens.h5 PEAK=$peak bash "$ROOT/tools/bench/step.sh"; } >>"$OUT/results.md"
echo "bench: parallel layouts (memory, communication, bubble, dp throughput)" >&2
{ echo; "$PYTHON" "$ROOT/tools/bench/parallel.py" --tessera "$ROOT/bin/tessera" --data "$ROOT/data/default" \
    --out "$OUT"; } >>"$OUT/results.md"
echo "bench: ZeRO stages 0-3 side by side (tools/bench/zero.sh)" >&2
{ echo; OUT=$OUT PYTHON=$PYTHON TOKENS=$OUT/tokens.h5 bash "$ROOT/tools/bench/zero.sh"; } >>"$OUT/results.md"
echo "bench: context parallelism, T=8192 on cp = 1, 2, 4 and T=32768 on cp=4 (tools/bench/cp.sh)" >&2
{ echo; OUT=$OUT PYTHON=$PYTHON TOKENS=$ROOT/data/default/train.h5 bash "$ROOT/tools/bench/cp.sh"; } >>"$OUT/results.md"
echo "bench: FP8 convergence, fp32 vs simulated fp8, GPT-2 and LLaMA (tools/bench/fp8.sh)" >&2
{ echo; OUT=$OUT PYTHON=$PYTHON DATA=$ROOT/data/default THREADS=$THREADS bash "$ROOT/tools/bench/fp8.sh"; } >>"$OUT/results.md"
echo "bench: mixture of experts against dense, ep = 1, 2, 4 (tools/bench/moe.sh)" >&2
{ echo; OUT=$OUT PYTHON=$PYTHON THREADS=1 bash "$ROOT/tools/bench/moe.sh"; } >>"$OUT/results.md"
echo "bench: update rules, AdamW and Adafactor on 1 and 2 ranks (tools/bench/optim.sh)" >&2
{ echo; OUT=$OUT PYTHON=$PYTHON THREADS=$THREADS bash "$ROOT/tools/bench/optim.sh"; } >>"$OUT/results.md"
echo "bench: checkpoint stall, synchronous and checkpoint.async (tools/bench/checkpoint.sh)" >&2
{ echo; DECK=$OUT/deck.yaml OUT=$OUT PYTHON=$PYTHON bash "$ROOT/tools/bench/checkpoint.sh"; } >>"$OUT/results.md"
echo "bench: tokenizer encoding, 100 MB (tools/bench/tokenizer.sh)" >&2
{ echo; echo "## Tokenizer encoding"; echo; OUT=$OUT PYTHON=$PYTHON bash "$ROOT/tools/bench/tokenizer.sh"; } >>"$OUT/results.md"
echo "bench: tessera data prepare, 100 MB of JSON Lines .zst on 1, 2, 4 ranks (tools/bench/data_prepare.sh)" >&2
{ echo; echo "## Data preparation"; echo; OUT=$OUT PYTHON=$PYTHON bash "$ROOT/tools/bench/data_prepare.sh"; } >>"$OUT/results.md"
echo "bench: data loader (1 GiB per format; tools/bench/data.sh)" >&2
{ echo; echo "## Data loader"; echo; PYTHON=$PYTHON bash "$ROOT/tools/bench/data.sh"; } >>"$OUT/results.md"
cat "$OUT/results.md"
