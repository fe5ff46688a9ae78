#!/usr/bin/env bash
# Errors on many ranks. A layout that does not fit is refused by every rank before anything is
# allocated, with one message (rank 0's) and a clean exit 2. A failure that only one rank meets
# ends every rank promptly, with one message from the rank that saw it: a token id past the
# vocabulary hidden in a window that only data-parallel rank 1 reads in the first step, while
# rank 0 goes on to wait in the gradient all-reduce.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck fail)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
"$PYTHON" - <<'EOF'
import h5py, numpy as np
from tessera_data import permute
T, n, seed, vocab = 16, 100, 7, 50
tokens = np.random.default_rng(0).integers(0, vocab, n * T + 1).astype(np.uint16)
w = permute(4, n, seed, 0)                        # global sample 4: dp rank 1's first (B=8, dp=2)
rank0 = {permute(j, n, seed, 0) for j in range(4)}
assert w not in rank0
tokens[w * T + 8] = 60                            # inside window w only
with h5py.File("onebad.h5", "w") as f:
    f.create_dataset("tokens", data=tokens)
    f.attrs["vocab_size"] = np.int64(vocab)
    f.attrs["eot"] = np.int64(vocab - 1)
    f.attrs["tokenizer"] = np.bytes_("byte")
EOF
bad_index=$("$PYTHON" -c "from tessera_data import permute; print(permute(4, 100, 7, 0) * 16 + 8)")
start=$(date +%s)
# data.check_tokens=false: the scan before training (checked below) would find it first.
timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" data.train="$WORK/onebad.h5" data.val= \
  parallel.dp=2 train.batch_size=8 train.micro_batch=1 data.check_tokens=false >out.txt 2>err.txt
rc=$?
took=$(( $(date +%s) - start ))
msgs=$(grep -c "token $bad_index (.*) has id 60" err.txt)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$msgs" -eq 1 ] && grep -q "^rank 1: .*onebad\.h5: token $bad_index (.*) has id 60" err.txt; then
  pass "rank 1's bad token ended the job in ${took} s (exit $rc) with one message: $(grep onebad err.txt)"
else
  fail "exit $rc after ${took} s, $msgs messages"; sed 's/^/    err: /' err.txt | head -10
fi

# With the scan before training (the default) the same file is refused by every rank before the
# first step: one line from rank 0, exit 2, nothing on stdout.
timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" data.train="$WORK/onebad.h5" data.val= \
  parallel.dp=2 train.batch_size=8 train.micro_batch=1 >out.txt 2>err.txt
rc=$?
if [ "$rc" -eq 2 ] && [ "$(wc -l <err.txt)" -eq 1 ] && [ ! -s out.txt ] &&
   grep -q "^$WORK/onebad\.h5: token $bad_index ($WORK/onebad\.h5 at byte [0-9]*) has id 60" err.txt; then
  pass "token scan: every rank refused before training: $(cat err.txt)"
else
  fail "token scan: exit $rc"; sed 's/^/    err: /' err.txt | head -5; sed 's/^/    out: /' out.txt | head -3
fi

# layout_error NAME NP PATTERN OVERRIDES...: every rank refuses; one line, exit 2, no abort.
layout_error() {
  local name=$1 np=$2 pattern=$3
  shift 3
  timeout 60 $MPIEXEC -n "$np" "$TESSERA" train "$deck" "$@" >out.txt 2>err.txt
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l <err.txt)" -eq 1 ] && grep -Eq -- "$pattern" err.txt && [ ! -s out.txt ]; then
    pass "$name: $(cat err.txt)"
  else
    fail "$name: exit $rc"; sed 's/^/    err: /' err.txt | head -5; sed 's/^/    out: /' out.txt | head -3
  fi
}
layout_error world_size 3 "parallel: dp=2 x tp=1 x pp=1 = 2 ranks, but the job has 3" parallel.dp=2
layout_error tp_heads 3 "parallel.tp = 3 does not divide model.n_head = 2" parallel.tp=auto
layout_error pp_layers 4 "stage|layer" parallel.pp=auto
layout_error batch 2 "batch_size|micro" parallel.dp=2 train.batch_size=3 train.micro_batch=1
# The model's other splits and the schedules' rules, where tp or pp is auto (the deck cannot check
# them before the world size is known).
llama=(model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.ffn_multiple=32)
layout_error tp_kv_heads 4 "parallel.tp = 4 does not divide model.n_kv_head = 2" "${llama[@]}" parallel.tp=auto
layout_error sp_rows 2 "parallel.sequence_parallel splits the 15 rows of a micro-batch .* over parallel.tp = 2, which does not divide them" \
  parallel.tp=auto parallel.sequence_parallel=true data.seq_len=15 train.batch_size=2 train.micro_batch=1
layout_error virtual_groups 2 "parallel.virtual_stages = 2 runs micro-batches in groups of parallel.pp = 2, but a step has 1" \
  parallel.pp=auto parallel.virtual_stages=2 model.n_layer=4 train.batch_size=2 train.micro_batch=2
# Sequence parallelism with tp = 1 is a warning, not an error.
if timeout 60 "$TESSERA" train "$deck" train.steps=1 parallel.sequence_parallel=true run.dir="$WORK/sp1" >sp1.log 2>&1 &&
   grep -q "^warning: parallel.sequence_parallel has no effect with tp = 1" sp1.log; then
  pass "sequence_parallel with tp = 1: $(grep '^warning' sp1.log)"
else
  fail "sequence_parallel with tp = 1"; tail -3 sp1.log | sed 's/^/    /'
fi
# A checkpoint of another model shape, restarted on 4 ranks: every rank reads the shape first.
timeout 60 $MPIEXEC -n 2 "$TESSERA" train "$deck" train.steps=1 run.dir="$WORK/small" parallel.dp=2 >/dev/null 2>&1
layout_error ckpt_shape 4 "model shape differs from the deck: model.n_embd 32 in the checkpoint, 64 in the deck" \
  parallel.tp=2 parallel.dp=2 model.n_embd=64 checkpoint.restart="$WORK/small/checkpoints"
finish
