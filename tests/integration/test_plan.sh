#!/usr/bin/env bash
# `tessera plan`: docs/planning.md's two searches complete in under a second each, without mpiexec;
# a plan's memory equals what the trainer counts for its own rank (the run refuses to start
# otherwise; test_comm_volume.sh holds every rank's bytes equal to the plan's on ten layouts);
# a layout that cannot fit is refused with its numbers; bad machine files (a bad value, a key
# twice, a FIFO, a directory, a device) and arguments are one line, exit 2; an odd machine name
# leaves --json valid.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck plan)
cd "$WORK" || exit 1

# The searches of docs/planning.md, timed by the plan itself: its CPU time, which on this shared
# machine does not count other users' load as its wall time does (both are printed).
for args in "$ROOT/input/gpt2-124m.yaml --ranks 8 --machine h100-sxm" \
            "$ROOT/input/llama-1b.yaml --ranks 64 --machine h100-sxm"; do
  # shellcheck disable=SC2086
  if "$TESSERA" plan $args --search --json >search.json 2>search.err &&
     s=$("$PYTHON" -c 'import json,sys; d=json.load(open("search.json"));
assert d["fits"] > 0 and d["layouts"][0]["fits"], d["layouts"][:1]
t=[l["step_seconds"] for l in d["layouts"] if l["fits"]]
assert t == sorted(t), "not fastest first"
print(d["cpu_seconds"], d["fits"], len(d["layouts"]), d["seconds"])') &&
     [ "$(echo "$s" | awk '$1 < 1.0 {print "ok"}')" = ok ]; then
    pass "plan --search $(basename "${args%% *}") ${args#* }: $s (CPU seconds, fitting, tried, wall seconds)"
  else
    fail "plan --search $args: ${s:-$(head -c 300 search.err)}"
  fi
done

# A plan's text names every stage and the step time; an 80 GB GPU refuses a 1B model on one
# rank without recompute at this micro-batch, with the numbers.
if out=$("$TESSERA" plan "$ROOT/input/gpt2-124m.yaml" --ranks 8 --machine a100-40gb \
           parallel.dp=2 parallel.tp=2 parallel.pp=2 2>&1) &&
   echo "$out" | grep -q "stage 0 tp 0-1:" && echo "$out" | grep -q "stage 1 tp 0-1:" &&
   echo "$out" | grep -qE "tokens/s, MFU [0-9.]+%"; then
  pass "plan prints each stage's memory, the bubble and the step time"
else
  fail "plan text: $out"
fi
# ZeRO-3 (FSDP-style) on the LLaMA 7B deck: 64 ranks hold 18/64 bytes of fp32 state per
# parameter (bf16 copy 2, master 4, gradient 4, moments 8, each a 64th; the units' padding at
# most 64 elements each), and for an (asynchronous) checkpoint host copies of their parts only
# (parameters and two moments), and fit an 80 GB GPU; the same deck with ZeRO-1 does not, by its
# numbers.
if "$TESSERA" plan "$ROOT/input/llama-7b-fsdp.yaml" --ranks 64 --machine h100-sxm --json \
     >fsdp.json 2>fsdp.err &&
   s=$("$PYTHON" -c 'import json; d=json.load(open("fsdp.json")); r=d["roles"][0]
assert d["fits"] and d["max_rank_bytes"] < 80e9, d["max_rank_bytes"]
N = r["param_bytes"] / 4
state = r["param_buffer_bytes"] + r["grad_buffer_bytes"] + r["optimizer_buffer_bytes"] - 8
assert 18 * N / 64 <= state <= 18 * (N + 64 * 300) / 64, (state, 18 * N / 64)
assert r["checkpoint_copy_bytes"] <= 12 * (N + 64 * 300) / 64, r["checkpoint_copy_bytes"]
most = d["max_rank_bytes"] / 1e9
print(f"{most:.1f} GB a rank, state {state/1e9:.3f} GB = {state/N:.4f} bytes/parameter")'); then
  pass "llama-7b-fsdp: ZeRO-3 on 64 H100s fits: $s"
else
  fail "llama-7b-fsdp: ${s:-$(head -c 300 fsdp.err)}"
fi
# ZeRO-1 in bf16 keeps the whole bf16 copy (2) and gradient (4) on every rank and a 64th of the
# fp32 master and the moments (12/64): Megatron's distributed optimizer, 6.1875 bytes/parameter
# (10.125 while the master was whole on every rank), which with the activations fits: 82 GB.
"$TESSERA" plan "$ROOT/input/llama-7b-fsdp.yaml" --ranks 64 --machine h100-sxm parallel.zero=1 \
  --json >zero1.json 2>/dev/null
if s=$("$PYTHON" -c 'import json; d=json.load(open("zero1.json")); r=d["roles"][0]
N = r["param_bytes"] / 4
state = r["param_buffer_bytes"] + r["grad_buffer_bytes"] + r["optimizer_buffer_bytes"]
assert d["fits"] and d["max_rank_bytes"] < 85.9e9, d["max_rank_bytes"]
assert abs(state / N - (6 + 12 / 64)) < 1e-3, state / N
most = d["max_rank_bytes"] / 1e9
print(f"{most:.1f} GB a rank, state {state/N:.4f} bytes/parameter")'); then
  pass "llama-7b-fsdp with ZeRO-1: $s, fits"
else
  fail "llama-7b-fsdp with ZeRO-1 counts: $s"
fi
ALLOW_STDOUT=1 expect_error "a layout that does not fit" 2 "does not fit: stage 0 tp 0 needs .* GB of 85.9 GB" \
  "$TESSERA" plan "$ROOT/input/llama-1b.yaml" --ranks 1 --machine h100-sxm parallel.tp=1 train.micro_batch=64
ALLOW_STDOUT=1 expect_error "no layout of N ranks fits" 2 "no layout of 1 ranks fits h100-sxm: the smallest.*short by" \
  "$TESSERA" plan "$ROOT/input/llama-1b.yaml" --ranks 1 --machine h100-sxm --search \
  model.n_layer=128 train.batch_size=1 train.micro_batch=1

# Machine files: a good one plans; each bad line is named by file:line:col.
cat >node.yaml <<'M'
name: test-node
peak_tflops_fp32: 20
peak_tflops_bf16: 300
memory_gb: 64
memory_bandwidth_gbs: 1600
gpus_per_node: 4
intra_node_gbs: 100
inter_node_gbs: 25
M
if out=$("$TESSERA" plan "$ROOT/input/gpt2-124m.yaml" --ranks 4 --machine-file node.yaml parallel.dp=4 2>&1) &&
   echo "$out" | grep -q "on test-node"; then
  pass "a machine file plans"
else
  fail "machine file: $out"
fi
sed 's/memory_gb: 64/memory_gb: lots/' node.yaml >bad1.yaml
expect_error "machine file: a bad number" 2 "bad1.yaml:4:12: memory_gb: expected a number, got 'lots'" \
  "$TESSERA" plan "$deck" --ranks 1 --machine-file bad1.yaml
sed 's/gpus_per_node/gpus_per_nod/' node.yaml >bad2.yaml
expect_error "machine file: an unknown key" 2 "bad2.yaml:6:1: gpus_per_nod: unknown key" \
  "$TESSERA" plan "$deck" --ranks 1 --machine-file bad2.yaml
grep -v inter_node node.yaml >bad3.yaml
expect_error "machine file: a missing key" 2 "bad3.yaml:1:1: inter_node_gbs: missing" \
  "$TESSERA" plan "$deck" --ranks 1 --machine-file bad3.yaml
# The network's tiers: non-positive NICs, bandwidths and efficiencies named by their key.
for bad in "nics_per_node: 0|nics_per_node: must be >= 1" "nics_per_node: 1.5|nics_per_node: expected an integer, got '1.5'" \
           "intra_node_gbs: 0|intra_node_gbs: must be >= 0.001" "inter_node_gbs: -25|inter_node_gbs: must be >= 0.001" \
           "gemm_efficiency: 0|gemm_efficiency: must be >= 0.001" "memory_efficiency: 1.5|memory_efficiency: must be <= 1"; do
  key=${bad%%:*} line=${bad%%|*} want=${bad#*|}
  { grep -v "^$key:" node.yaml; echo "$line"; } >bad4.yaml
  expect_error "machine file: $line" 2 "bad4.yaml:[0-9]*:[0-9]*: $want" \
    "$TESSERA" plan "$deck" --ranks 1 --machine-file bad4.yaml
done
# Read as strictly as a deck: every number within a range (1e300 made a NaN plan, 3e9 GPUs a node
# of -2147483648), a key given twice refused, a sequence or a map where a number belongs named at
# its place; each one line naming the file, exit 2.
for bad in "gemm_tile: 1e300|gemm_tile: must be <= 4096 \(.*\), got 1e\+300" \
           "gemm_half: 1e300|gemm_half: must be <= 1e\+06 \(.*\), got 1e\+300" \
           "gpus_per_node: 3e9|gpus_per_node: expected an integer, got '3e9'" \
           "gpus_per_node: 3000000000|gpus_per_node: expected an integer from -2147483648 to 2147483647, got '3000000000'" \
           "memory_gb: [64, 80]|memory_gb: expected a number, got a sequence" \
           "memory_gb: {a: 1}|memory_gb: expected a number, got a map" \
           "name: [a]|name: expected a string, got a sequence"; do
  key=${bad%%:*} line=${bad%%|*} want=${bad#*|}
  { grep -v "^$key:" node.yaml; echo "$line"; } >bad5.yaml
  expect_error "machine file: $line" 2 "^bad5.yaml:[0-9]+:[0-9]+: $want$" \
    "$TESSERA" plan "$deck" --ranks 1 --machine-file bad5.yaml
done
{ cat node.yaml; echo "memory_gb: 80"; } >twice.yaml
expect_error "machine file: a key given twice" 2 "^twice.yaml:9:1: memory_gb: duplicate key \(first at line 4\)$" \
  "$TESSERA" plan "$deck" --ranks 1 --machine-file twice.yaml
# Only a regular file is read: a FIFO (which no one writes: opening it to read would wait for
# ever), a directory and a device are named as such before anything opens them.
mkfifo node.fifo
mkdir node.dir
for what in "node.fifo|a FIFO \(named pipe\)" "node.dir|a directory" "/dev/zero|a character device"; do
  path=${what%%|*} kind=${what#*|}
  expect_error "machine file: $path" 2 "^machine file $path is $kind, not a file$" \
    timeout 20 "$TESSERA" plan "$deck" --ranks 1 --machine-file "$path"
done
# A name with a quote, a backslash and non-ASCII text leaves --json valid JSON, the name intact;
# a name of more than one line is refused.
{ grep -v "^name:" node.yaml; echo 'name: "odd \"node\" \\ caf\u00e9"'; } >odd.yaml
if out=$("$TESSERA" plan "$ROOT/input/gpt2-124m.yaml" --ranks 4 --machine-file odd.yaml parallel.dp=4 \
           --json 2>&1) &&
   name=$(echo "$out" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["machine"])') &&
   [ "$name" = 'odd "node" \ café' ] &&
   s=$("$TESSERA" plan "$ROOT/input/gpt2-124m.yaml" --ranks 4 --machine-file odd.yaml --json \
         --search 2>&1 | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); print(d["machine"], len(d["layouts"]))'); then
  pass "plan --json with an odd machine name: $name; --search: $s"
else
  fail "plan --json with an odd machine name: ${out:0:300}"
fi
{ grep -v "^name:" node.yaml; echo 'name: "two\nlines"'; } >lines.yaml
expect_error "machine file: a name of two lines" 2 "^lines.yaml:8:7: name: expected one line of text, got 'two\\\\nlines'$" \
  "$TESSERA" plan "$deck" --ranks 1 --machine-file lines.yaml
# Layout sizes near the int's limit: the numbers in the message are the true ones (2 x 2^30 was
# -2147483648, a signed overflow).
expect_error "parallel.cp = 2^30" 2 "parallel.cp=1073741824: data.seq_len = 16 is not divisible by 2 x parallel.cp = 2147483648 " \
  "$TESSERA" plan "$deck" --ranks 1 model.attention=fused parallel.cp=1073741824
expect_error "unknown machine" 2 "--machine dgx9: no such machine" \
  "$TESSERA" plan "$deck" --ranks 1 --machine dgx9
expect_error "bad --ranks" 2 "--ranks: expected an integer" "$TESSERA" plan "$deck" --ranks x
expect_error "deck error" 2 "train.micro_batch=-1: must be >= 0" \
  "$TESSERA" plan "$deck" --ranks 1 train.micro_batch=-1
expect_error "a layout the deck cannot take" 2 "parallel.tp = 3 does not divide" \
  "$TESSERA" plan "$deck" --ranks 3 parallel.tp=3
# GPT 1T with interleaved stages (Narayanan et al. 2021's shape and layout, v = 2): the pipeline's
# send buffers are two per chunk, not one per micro-batch in flight (6.6 GB), so it fits 80 GB.
t1=(device.backend=cuda device.precision=bf16 train.batch_size=3072 train.micro_batch=1 model.arch=gpt2
    model.block_size=2048 data.seq_len=2048 model.vocab_size=51200 model.n_layer=128 model.n_head=160
    model.n_embd=25600 parallel.tp=8 parallel.pp=64 parallel.dp=6 train.recompute=full
    parallel.virtual_stages=2)
if "$TESSERA" plan "$ROOT/input/gpt2-124m.yaml" --ranks 3072 --machine a100-80gb --json "${t1[@]}" \
     >t1.json 2>t1.err &&
   out=$("$PYTHON" -c '
import json, sys
p = json.load(open("t1.json"))
pool = max(r["pipeline_buffer_bytes"] for r in p["roles"])
assert p["fits"], "does not fit"
assert pool == 2 * 2 * 2048 * 25600 * 2, "pool %d" % pool
print("%.1f GB a rank, send buffers %.0f MB" % (p["max_rank_bytes"] / 1e9, pool / 1e6))' 2>&1); then
  pass "GPT 1T at v=2 fits an 80 GB A100: $out (2 per chunk of 2)"
else
  fail "GPT 1T at v=2: $out $(tail -1 t1.err)"
fi
# FP8 (device.precision fp8, docs/fp8.md): on an H100 the linear layers' GEMMs run at
# the FP8 peak (1979 TFLOP/s dense), so the step is shorter than bf16's and the MFU is stated
# against that peak; each GEMM weight has two one-byte copies more, its codes and their transpose
# (GPT-2 124M: 2 x 85M); an A100 has no FP8 and refuses, with its name.
fp8_plan() {  # fp8_plan PRECISION: "step_seconds mfu param_buffer_bytes"
  "$TESSERA" plan "$ROOT/input/gpt2-124m.yaml" --ranks 8 --machine h100-sxm parallel.dp=8 \
    device.backend=auto device.precision="$1" --json |
    "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); print(d["step_seconds"], d["mfu"], d["roles"][0]["param_buffer_bytes"])'
}
if b=$(fp8_plan bf16) && f=$(fp8_plan fp8) && s=$("$PYTHON" - "$b" "$f" <<'EOF'
import sys
(tb, mb, pb), (tf, mf, pf) = ([float(x) for x in a.split()] for a in sys.argv[1:])
extra = pf - pb
assert tf < tb, (tf, tb)
assert 169e6 < extra < 171e6, extra  # 2 x 12 layers x 12 C^2, C = 768: 2 x 84.9M one-byte codes
# The same model FLOPs over a shorter step, against a peak twice bf16's.
assert abs(mf * 1979 - mb * 989.5 * tb / tf) < 0.01 * mf * 1979, (mf, mb)
print(f"step {tb:.3f} s -> {tf:.3f} s, MFU {100*mb:.1f}% of the bf16 peak -> {100*mf:.1f}% "
      f"of the FP8 peak, +{extra/1e6:.1f} MB of FP8 weights")
EOF
); then pass "plan fp8 on h100-sxm: $s"
else fail "plan fp8: bf16 '$b' fp8 '$f' $s"; fi
expect_error "plan fp8 on an A100" 2 "device.precision = fp8: machine a100-40gb has no FP8 \(it needs compute capability 8.9" \
  "$TESSERA" plan "$ROOT/input/gpt2-124m.yaml" --ranks 8 --machine a100-40gb device.backend=auto device.precision=fp8
finish
