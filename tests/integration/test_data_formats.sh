#!/usr/bin/env bash
# Every token format tessera reads, written by tests/integration/write_formats.py from the
# published layouts: `tessera data info` reports each, `tessera data dump` gives the same ids as
# h5py reading the source (across an llm.c shard boundary too), and training on each format gives
# losses equal to the bit to training on the same tokens in an HDF5 file.
source "$(dirname "$0")/lib.sh"
test_data
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
N=200000
docs=$("$PYTHON" "$ROOT/tests/integration/write_formats.py" good "$DATA/train.h5" "$N" "$WORK") ||
  { fail "writing the format files"; finish; }

# info_has NAME PATTERN ARGS...: `tessera data info ARGS` succeeds and prints a line matching PATTERN.
info_has() {
  local name=$1 pattern=$2
  shift 2
  if "$TESSERA" data info "$@" >info.txt 2>&1 && grep -Eq -- "$pattern" info.txt; then
    pass "data info $name: $(grep -E -- "$pattern" info.txt | head -1 | sed 's/^ *//')"
  else
    fail "data info $name: no '$pattern' in:"; sed 's/^/    /' info.txt | head -12
  fi
}
info_has llmc_format "format +llmc" "$WORK/shard_*.bin"
info_has llmc_tokens "tokens +$N\$" "$WORK/shard_*.bin"
info_has llmc_shards "files +3\$" "$WORK/shard_*.bin"
info_has llmc_tokenizer "tokenizer +gpt2, vocab_size 50257" "$WORK/shard_*.bin"
info_has megatron_format "format +megatron" "$WORK/mega"
info_has megatron_documents "documents +$docs\$" "$WORK/mega.idx"
info_has megatron_tokens "tokens +$N\$" "$WORK/mega.bin"
info_has raw16 "dtype +uint16" "$WORK/raw16.bin" --format raw --dtype uint16
info_has raw32 "tokens +$N\$" "$WORK/raw32.bin" --format raw --dtype uint32
info_has hdf5_u32 "dtype +uint32" "$WORK/tok32.h5"
info_has hdf5_documents "documents +[0-9]+\$" "$DATA/train.h5"
info_has hdf5_offset "tok32\.h5: $N tokens at byte [0-9]+" "$WORK/tok32.h5"

# dump: ids 66650..66689 straddle the first llm.c shard boundary (66666).
want=$("$PYTHON" -c 'import h5py,sys; print(" ".join(map(str, h5py.File(sys.argv[1])["tokens"][66650:66690])))' "$DATA/train.h5")
for spec in "shard_*.bin" mega tok32.h5 "raw16.bin --format raw --dtype uint16" \
            "raw32.bin --format raw --dtype uint32"; do
  read -r file flags <<<"$spec"
  # shellcheck disable=SC2086  # flags are words
  got=$("$TESSERA" data dump "$WORK/$file" --start 66650 --count 40 $flags 2>&1)
  if [ "$got" = "$want" ]; then pass "data dump $file = h5py ids 66650..66689"
  else fail "data dump $file: '$got' != '$want'"; fi
done

# Training: the same tokens in five layouts give the same losses, to the bit.
deck=$(tiny_deck formats)
train_on() {
  local name=$1
  shift
  "$TESSERA" train "$deck" data.val= model.vocab_size=257 train.steps=6 run.dir="$WORK/run_$name" \
    "$@" >"$name.log" 2>&1 || { fail "training on $name"; tail -3 "$name.log"; return; }
  losses "$WORK/run_$name/metrics.jsonl" >"$name.losses"
}
train_on hdf5 data.train="$WORK/tok32.h5"
train_on llmc data.train="$WORK/shard_*.bin"
train_on megatron data.train="$WORK/mega"
train_on raw16 data.train="$WORK/raw16.bin" data.format=raw data.dtype=uint16
train_on raw32 data.train="$WORK/raw32.bin" data.format=raw data.dtype=uint32
train_on hdf5_sync data.train="$WORK/tok32.h5" data.prefetch=0 data.direct_io=false
for name in llmc megatron raw16 raw32 hdf5_sync; do
  if [ -s hdf5.losses ] && cmp -s hdf5.losses "$name.losses"; then
    pass "training on $name: $(wc -l <"$name.losses") losses equal to the HDF5 run's"
  else
    fail "training on $name: losses differ from the HDF5 run"; diff hdf5.losses "$name.losses" | head -4
  fi
done
grep -q "loader: prefetch 4 steps ahead" llmc.log && pass "llm.c shards read by the prefetch thread: $(grep loader: llmc.log)" ||
  fail "no prefetch line in the llm.c log"
grep -q "loader: read on the main thread" hdf5_sync.log && pass "data.prefetch=0 reads in the step: $(grep loader: hdf5_sync.log)" ||
  fail "no main-thread loader line with data.prefetch=0"
grep -Eq "data wait [0-9.]+%" llmc.log && grep -q '"data_wait":' "$WORK/run_llmc/metrics.jsonl" &&
  pass "loader wait logged per interval and in metrics.jsonl" || fail "no data wait in the log"
finish
