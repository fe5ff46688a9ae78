#!/usr/bin/env bash
# Malformed token files of every format, on 2 ranks: each is one line naming the file and the
# offset or index where it went wrong, exit 2 (1 for a missing file), before training starts
# (nothing on stdout), from rank 0 alone, and no hang (each run is bounded by a timeout).
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck errors)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
"$PYTHON" "$ROOT/tests/integration/write_formats.py" bad "$WORK" || { fail "writing bad files"; finish; }
W=$WORK
run2() { timeout 60 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 data.val= model.vocab_size=257 "$@"; }

expect_error truncated_shard 2 "^$W/truncated\.bin: truncated: the header \(byte 8\) says 6000 tokens, 13024 bytes in all, but the file has 11024 bytes$" \
  run2 data.train="$W/truncated.bin"
expect_error wrong_magic_auto 2 "^$W/magic\.bin: not a token file tessera recognises: bytes 0-3 are 20240519" \
  run2 data.train="$W/magic.bin"
expect_error wrong_magic_llmc 2 "^$W/magic\.bin: wrong magic 20240519 at byte 0, llm\.c shards start with 20240520$" \
  run2 data.train="$W/magic.bin" data.format=llmc
expect_error header_count 2 "^$W/count\.bin: the header's token count 4000 \(byte 8\) disagrees with the file size: 11024 bytes hold 5000 tokens$" \
  run2 data.train="$W/count.bin"
expect_error short_header 2 "^$W/header_only\.bin: truncated llm\.c shard: 400 bytes, less than the 1024-byte header$" \
  run2 data.train="$W/header_only.bin" data.format=llmc
expect_error empty_file 2 "^$W/empty\.bin: empty file, no tokens$" \
  run2 data.train="$W/empty.bin"
expect_error token_over_vocab 2 "^$W/highid\.bin: token 3210 \($W/highid\.bin at byte 7444\) has id 300, not below the model's vocab_size 257$" \
  run2 data.train="$W/highid.bin"
expect_error idx_past_bin 2 "^$W/pastend\.idx: sequence 9 \(pointer 13000, 500 tokens\) runs past the end of $W/pastend\.bin \(10000 bytes\)$" \
  run2 data.train="$W/pastend"
expect_error idx_magic 2 "^$W/badidx\.idx: wrong magic at byte 0" \
  run2 data.train="$W/badidx"
expect_error idx_truncated 2 "^$W/shortidx\.idx: truncated: the header says 10 sequences and 11 document entries, 242 bytes, but the file has 60$" \
  run2 data.train="$W/shortidx.idx"
expect_error raw_odd 2 "^$W/odd\.raw: 10001 bytes is not a whole number of uint16 tokens: truncated at byte 10000$" \
  run2 data.train="$W/odd.raw" data.format=raw
expect_error glob_nothing 2 "^$W/nothing_\*\.bin: the glob matches no file$" \
  run2 data.train="$W/nothing_*.bin"
expect_error missing_prefix 1 "^cannot read token file $W/gone: no such file \(nor a Megatron prefix" \
  run2 data.train="$W/gone"
expect_error blend_bad_member 2 "^$W/empty\.bin: empty file, no tokens$" \
  run2 data.train="0.5 $W/count.bin 0.5 $W/empty.bin" data.format=raw
expect_error blend_syntax 2 "data\.train=0\.5 .*: a blend is \"WEIGHT SOURCE WEIGHT SOURCE \.\.\.\", got 3 words" \
  run2 data.train="0.5 $W/a.bin $W/b.bin"
expect_error blend_weight 2 "data\.train=0\.5 .*: blend weight 2 must be > 0, got -1" \
  run2 data.train="0.5 $W/a.bin -1 $W/b.bin"
expect_error bad_val 2 "^$W/empty\.bin: empty file, no tokens$" \
  run2 data.train="$W/count.bin" data.format=raw data.val="$W/empty.bin"
expect_error data_info_too 2 "^$W/truncated\.bin: truncated: the header \(byte 8\)" \
  "$TESSERA" data info "$W/truncated.bin"
expect_error dump_past_end 2 "^$W/count\.bin: --start 5500 --count 20 runs past the end \(5512 tokens: the last is 5511\)$" \
  "$TESSERA" data dump "$W/count.bin" --format raw --start 5500 --count 20
if ls "$WORK"/errors/checkpoints/* >/dev/null 2>&1; then fail "a refused run wrote a checkpoint"
else pass "no refused run wrote a checkpoint"; fi
finish
