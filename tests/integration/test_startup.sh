#!/usr/bin/env bash
# Start-up under hostile conditions. A stop signal before the first step (here during a long token
# scan) ends the job at once with its status, on 1 and 2 ranks. FIFOs, devices and directories
# given as deck, data or checkpoint are refused by name without blocking; a deck is read with a
# size limit. Absurd sizes are deck errors with their reason, and a model larger than the machine
# is refused with the numbers before anything is allocated. Integers on the command line and in
# checkpoints are range-checked, never narrowed. Unknown options, unterminated quotes and
# unreadable checkpoints each get a line that says what is wrong.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck start)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
W=$WORK

# 1. SIGTERM (1 rank) and SIGINT (2 ranks) during the token scan of 1G tokens (a sparse file: no
# disk is used; the scan takes about 12 s on one core).
truncate -s 2G big.bin
scan_stop() {  # scan_stop NAME NP SIG STATUS
  local name=$1 np=$2 sig=$3 status=$4
  $MPIEXEC -n "$np" "$TESSERA" train "$deck" data.train="$W/big.bin" data.format=raw model.vocab_size=257 \
    data.val= parallel.dp="$np" run.dir="$W/$name" >"$name.out" 2>"$name.err" &
  local job=$!
  # deck.yaml is written right before the scan starts; the scan then takes seconds.
  wait_for "$W/$name/deck.yaml" 30
  sleep 0.5
  local sent=$SECONDS
  pkill -"$sig" -f "^$TESSERA train .*run.dir=$W/$name\$"
  wait "$job"
  local rc=$? took=$((SECONDS - sent))
  [ "$rc" -eq 0 ] && rc=$(cat "$W/$name/exit_status" 2>/dev/null)  # mpiexec, signalled, says 0
  if [ "$rc" -eq "$status" ] && [ "$took" -le 3 ] &&
     grep -q "^stop: SIG$sig during start-up (the token scan): no checkpoint written, exit $status" "$name.err" &&
     [ "$(cat "$W/$name/exit_status")" = "$status" ] && ! ls "$W/$name/checkpoints/"*.h5 >/dev/null 2>&1; then
    pass "SIG$sig during the token scan on $np rank(s): exit $status within $took s: $(head -1 "$name.err")"
  else
    fail "SIG$sig during the token scan on $np rank(s): exit $rc after $took s"; head -3 "$name.err"
  fi
}
scan_stop scan_term 1 TERM 3
scan_stop scan_int 2 INT 130

# 2. Paths that are not files, as deck, checkpoint and data; none may block.
mkfifo fifo && mkdir -p adir && ln -s loop.yaml loop.yaml
expect_error deck_fifo 2 "^deck $W/fifo is a FIFO \(named pipe\), not a file$" timeout 10 "$TESSERA" train "$W/fifo"
expect_error deck_directory 2 "^deck $W/adir is a directory, not a file$" timeout 10 "$TESSERA" train "$W/adir"
expect_error deck_device 2 "^deck /dev/zero is a character device, not a file$" timeout 10 "$TESSERA" train /dev/zero
expect_error deck_link_loop 1 "^cannot read deck $W/loop\.yaml: Too many levels of symbolic links \(a symbolic link loop\)$" \
  timeout 10 "$TESSERA" train "$W/loop.yaml"
head -c 2000000 /dev/zero | tr '\0' '#' >huge.yaml
expect_error deck_too_large 2 "^deck $W/huge\.yaml is larger than 1024 KiB: not a deck\?$" timeout 10 "$TESSERA" train "$W/huge.yaml"
expect_error restart_fifo 2 "^checkpoint $W/fifo is a FIFO \(named pipe\), not a file$" \
  timeout 10 "$TESSERA" train "$deck" checkpoint.restart="$W/fifo"
expect_error sample_fifo 2 "^checkpoint $W/fifo is a FIFO \(named pipe\), not a file$" timeout 10 "$TESSERA" sample "$W/fifo"
expect_error eval_data_fifo 2 "^token file $W/fifo is a FIFO \(named pipe\), not a file$" \
  timeout 10 "$TESSERA" data info "$W/fifo"

# 3. Sizes: each bound is a deck error with its reason; a model larger than the machine is
# refused with the numbers, on every rank, before anything is allocated.
expect_error n_embd 2 "model\.n_embd=100000: must be <= 65536 \(the widest published models use 12288-25600\), got 100000$" \
  "$TESSERA" train "$deck" model.n_embd=100000
expect_error vocab_multiple 2 "model\.vocab_multiple=2147483647: must be <= 65536 \(padding wte further only wastes memory\), got 2147483647$" \
  "$TESSERA" train "$deck" model.vocab_multiple=2147483647
expect_error threads 2 "device\.threads=100000: must be <= 1024 \(more than any node has cores\), got 100000$" \
  "$TESSERA" train "$deck" device.threads=100000
expect_error readers 2 "data\.readers=100000: must be <= 256 .*, got 100000$" "$TESSERA" train "$deck" data.readers=100000
expect_error prefetch 2 "data\.prefetch=100000000: must be <= 256 .*, got 100000000$" "$TESSERA" train "$deck" data.prefetch=100000000
expect_error tokens_per_step 2 "train\.batch_size x data\.seq_len = 1000000000 x 16 tokens per step is more than 2147483647" \
  "$TESSERA" train "$deck" train.batch_size=1000000000 train.micro_batch=1
start=$SECONDS
expect_error memory_gpt3 2 "^the run needs [0-9.]+ GB of host memory on .* \(2 ranks: model buffers [0-9.]+ GB, data loader .*, checkpoint copies [0-9.]+ GB\), but [0-9.]+ (GB|MB) is available" \
  timeout 60 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 model.n_layer=96 model.n_head=96 \
    model.n_embd=12288 model.block_size=2048 data.seq_len=2048 train.batch_size=2 train.micro_batch=1 data.check_tokens=false
[ $((SECONDS - start)) -le 15 ] && pass "GPT-3 175B refused in $((SECONDS - start)) s" ||
  fail "GPT-3 175B took $((SECONDS - start)) s to refuse"

# 4. Integers: parsed into 64 bits and range-checked, on the command line and in checkpoints.
"$TESSERA" train "$deck" train.steps=1 run.dir="$W/ck" >/dev/null 2>&1 || fail "training a checkpoint"
ckpt=$W/ck/checkpoints/step_00000001.h5
expect_error sample_tokens_2_32 2 "^--tokens: expected an integer from 0 to 1073741824, got '4294967297'$" \
  "$TESSERA" sample "$ckpt" --tokens 4294967297
expect_error eval_batches_2_32 2 "^--batches: expected an integer from 1 to 2147483647, got '4294967297'$" \
  "$TESSERA" eval "$ckpt" --data "$DATA/val.h5" --batches 4294967297
expect_error dump_count_2_63 2 "^--count: expected an integer from 1 to 9223372036854775807, got '9223372036854775808'$" \
  "$TESSERA" data dump "$DATA/val.h5" --start 0 --count 9223372036854775808
expect_error dump_count_2_62 2 "^$DATA/val\.h5: --start 10 --count 4611686018427387904 runs past the end \(179477 tokens: the last is 179476\)$" \
  "$TESSERA" data dump "$DATA/val.h5" --start 10 --count 4611686018427387904
cp "$ckpt" narrowed.h5
"$PYTHON" -c 'import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f: f["model"].attrs["n_layer"] = np.int64(2**32 + 2)' narrowed.h5
expect_error checkpoint_attribute_2_32 2 "^$W/narrowed\.h5: attribute n_layer = 4294967298 is outside 1\.\.1024$" \
  "$TESSERA" sample "$W/narrowed.h5"

# The other commands keep the signals' default actions: SIGTERM ends a long dump at once. (A
# background job of a script ignores SIGINT, so SIGTERM it is.)
"$TESSERA" data dump "$W/big.bin" --format raw --start 0 --count 1000000000 >/dev/null 2>&1 &
job=$!
sleep 1
sent=$SECONDS
kill -TERM "$job"
for _ in $(seq 50); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  fail "SIGTERM to tessera data dump: still running after 5 s"; kill -KILL "$job"
else
  wait "$job"
  rc=$?
  [ "$rc" -eq 143 ] && pass "SIGTERM ends tessera data dump at once (exit $rc)" ||
    fail "SIGTERM to tessera data dump: exit $rc"
fi

# 5. Messages that say what is wrong.
expect_error unknown_option_last 2 "^tessera sample: unknown option --top-k \(see --help\)$" "$TESSERA" sample "$ckpt" --top-k
expect_error unknown_option_data 2 "^tessera data dump: unknown option --bogus" "$TESSERA" data dump "$DATA/val.h5" --bogus
head -c 3000 "$ckpt" >cut.h5
expect_error checkpoint_reason 1 "^cannot open checkpoint $W/cut\.h5: truncated file: eof = 3000" "$TESSERA" sample "$W/cut.h5"
printf 'run:\n  dir: "runs/x\ntrain:\n  steps: 10\ndata:\n  train: "%s"\n' "$DATA/train.h5" >quote.yaml
expect_error unterminated_quote 2 "^$W/quote\.yaml:2:8: run\.dir: the double-quoted value is not closed on its line \(add the closing quote\)$" \
  "$TESSERA" train "$W/quote.yaml"
finish
