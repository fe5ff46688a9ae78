#!/usr/bin/env bash
# `make bench`, data part: the loader's read throughput on a 1 GiB file of each format against a
# plain sequential read of the same file in the same run (O_DIRECT, and buffered with the file's
# pages dropped from the page cache: the disk's limit), then the loader's wait as a fraction of
# step time in training, with the prefetch thread and without it. Prints a markdown table.
#   DATA_GIB (1)  SEQ (1024)  BATCH (8)  READ_SECONDS (5)  READERS (4: loader threads)  PYTHON (/usr/bin/python3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
GIB=${DATA_GIB:-1}
SEQ=${SEQ:-1024}
BATCH=${BATCH:-8}
SECONDS_EACH=${READ_SECONDS:-5}
READERS=${READERS:-4}
# On the project's disk, not /tmp: tmpfs would refuse O_DIRECT and hold the file in memory.
OUT=$ROOT/build/bench/data
mkdir -p "$OUT"
TESSERA=${TESSERA:-$ROOT/bin/tessera}

echo "bench: writing $GIB GiB of random GPT-2 token ids in four formats to $OUT" >&2
"$PYTHON" - "$OUT" "$GIB" <<'PY'
import struct, sys
import h5py, numpy as np
out, gib = sys.argv[1], float(sys.argv[2])
n = int(gib * (1 << 30)) // 2
tokens = np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16)
tokens.tofile(f"{out}/raw.bin")
shards = 4
for i, part in enumerate(np.array_split(tokens, shards)):          # llm.c, version 1
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, len(part)
    with open(f"{out}/llmc_{i:06d}.bin", "wb") as f:
        f.write(header.tobytes())
        part.tofile(f)
seq = 1024                                                        # Megatron, one sequence per 1024
sizes = np.full(n // seq, seq, dtype="<i4")
sizes[-1] += n - seq * len(sizes)
pointers = (np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64)]) * 2).astype("<i8")
tokens.tofile(f"{out}/mega.bin")
with open(f"{out}/mega.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(sizes), len(sizes) + 1))
    f.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(sizes) + 1, dtype="<i8").tobytes())
with h5py.File(f"{out}/tokens.h5", "w") as f:                     # tessera HDF5, contiguous
    f.create_dataset("tokens", data=tokens)
    f.attrs["vocab_size"] = np.int64(50257)
    f.attrs["eot"] = np.int64(50256)
    f.attrs["tokenizer"] = np.bytes_("gpt2")
PY

rows=()
for spec in "tokens.h5" "llmc_*.bin" "mega" "raw.bin --format raw --dtype uint16"; do
  read -r file flags <<<"$spec"
  echo "bench: tessera data bench $file" >&2
  # shellcheck disable=SC2086  # flags are words
  line=$("$TESSERA" data bench "$OUT/$file" $flags --seq-len "$SEQ" --batch "$BATCH" --seconds "$SECONDS_EACH" \
           --readers "$READERS" |
         tee -a "$OUT/bench.log" | grep '^BENCH')
  rows+=("$line")
done

# Loader wait in training: a small model (fast steps make the ratio hardest) on the llm.c shards,
# each step reading its samples from random places in the 1 GiB.
train() {
  local name=$1 prefetch=$2
  rm -rf "$OUT/$name"
  cat >"$OUT/$name.yaml" <<DECK
model: {n_layer: 2, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 50257}
data: {train: "$OUT/llmc_*.bin", seq_len: 64, prefetch: $prefetch, check_tokens: false}
train: {steps: 40, batch_size: 4}
checkpoint: {every: 1000000, restart: none, dir: "$OUT/$name/ckpt"}
log: {every: 1, peak_gflops: 100}
run: {dir: "$OUT/$name"}
DECK
  echo "bench: training 40 steps, data.prefetch=$prefetch" >&2
  "$TESSERA" train "$OUT/$name.yaml" >"$OUT/$name.log"
}
train wait_prefetch 4
train wait_sync 0
"$PYTHON" - "$OUT/wait_prefetch/metrics.jsonl" "$OUT/wait_sync/metrics.jsonl" "${rows[@]}" <<'PY'
import json, statistics, sys
def wait(path):
    rows = [json.loads(l) for l in open(path) if '"train"' in l][1:]   # step 1 warms up
    return statistics.mean(r["data_wait"] for r in rows), statistics.median(r["ms"] for r in rows)
pre, sync = wait(sys.argv[1]), wait(sys.argv[2])
print("| format (1 file or 4 shards) | GiB | sequential O_DIRECT | sequential buffered, cache dropped | loader (random windows, O_DIRECT, reader threads) | loader / sequential O_DIRECT |")
print("|---|---|---|---|---|---|")
for line in sys.argv[3:]:
    f = dict(kv.split("=") for kv in line.split()[1:])
    seq, buf, ld = float(f["seq_direct_mbs"]), float(f["seq_buffered_mbs"]), float(f["loader_mbs"])
    print(f"| {f['format']} | {float(f['gib']):.2f} | {seq:.0f} MB/s | {buf:.0f} MB/s | {ld:.0f} MB/s "
          f"({float(f['loader_windows_s']):.0f} windows of {int(f['seq_len']) + 1} tokens/s) | {ld / seq:.2f} |")
print()
print("| training (4 x 64 tokens per step, 2-layer 128-wide model, llm.c shards) | median step | loader wait / step time |")
print("|---|---|---|")
print(f"| data.prefetch=4 (loader thread) | {pre[1]:.0f} ms | {100 * pre[0]:.3f}% (target < 1%) |")
print(f"| data.prefetch=0 (read in the step) | {sync[1]:.0f} ms | {100 * sync[0]:.3f}% |")
PY
