#!/usr/bin/env bash
# Token files that would read as zeros, or lie about themselves, are refused with one line before
# training (exit 2), by `train` on 2 ranks and by `data info`: /tokens never written, chunks
# missing or a damaged chunk index, a virtual dataset, an external link into another file, a contiguous dataset running
# past the end of its file (even with data.check_tokens=false), tokenizer attributes out of range.
# A chunked file truncated while a run reads it stops the run (exit 1) instead of training on
# zeros. Paths that are not files (a directory, a FIFO, a device, a link loop) say what they are.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck hostile)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1

"$PYTHON" - <<'EOF'
import os, struct
import h5py, numpy as np
ids = (np.arange(200000) % 250).astype(np.uint16)
def attrs(f, vocab=257, eot=256, tok="byte"):
    f.attrs["vocab_size"] = np.int64(vocab); f.attrs["eot"] = np.int64(eot)
    f.attrs["tokenizer"] = np.bytes_(tok)
with h5py.File("unwritten.h5", "w") as f:            # declared, never written
    f.create_dataset("tokens", shape=(200000,), dtype=np.uint16); attrs(f)
with h5py.File("partchunks.h5", "w") as f:           # 5 of 20 chunks written
    d = f.create_dataset("tokens", shape=(200000,), dtype=np.uint16, chunks=(10000,))
    d[:50000] = ids[:50000]; attrs(f)
with h5py.File("src.h5", "w") as f:
    f.create_dataset("tokens", data=ids)
layout = h5py.VirtualLayout(shape=(200000,), dtype=np.uint16)
layout[:] = h5py.VirtualSource("src.h5", "tokens", shape=(200000,))
with h5py.File("vds.h5", "w", libver="latest") as f:
    f.create_virtual_dataset("tokens", layout); attrs(f)
os.remove("src.h5")                                  # the virtual dataset's source is gone
with h5py.File("target.h5", "w") as f:
    f.create_dataset("pad", data=np.zeros(5000, np.uint8)); f.create_dataset("tokens", data=ids)
with h5py.File("extlink.h5", "w") as f:              # /tokens lives in target.h5
    f.create_dataset("filler", data=np.full(250000, 7, np.uint16))
    f["tokens"] = h5py.ExternalLink("target.h5", "/tokens"); attrs(f)
# A contiguous dataset whose file was cut short, with the superblock's end-of-file address
# (version 0 superblock, byte 40) cut to match, so that HDF5 itself opens it.
with h5py.File("short.h5", "w", libver="earliest") as f:
    f.create_dataset("tokens", data=ids); attrs(f)
size = os.path.getsize("short.h5") - 100000
with open("short.h5", "r+b") as f:
    f.truncate(size); f.seek(40); f.write(struct.pack("<Q", size))
for name, kw in [("eot_out", dict(eot=300)), ("eot_neg", dict(eot=-5)),
                 ("tok_unknown", dict(tok="tiktoken")), ("vocab_huge", dict(vocab=2**32 + 100, eot=5))]:
    with h5py.File(name + ".h5", "w") as f:
        f.create_dataset("tokens", data=ids); attrs(f, **kw)
with h5py.File("chunked.h5", "w") as f:              # read through HDF5
    f.create_dataset("tokens", data=np.tile(ids, 10), chunks=(4096,)); attrs(f)
with h5py.File("badchunk.h5", "w") as f:             # its 2nd chunk's size zeroed in the index
    f.create_dataset("tokens", data=np.tile(ids, 10), chunks=(1024,)); attrs(f)
raw = bytearray(open("badchunk.h5", "rb").read())
key = struct.pack("<IIQQ", 2048, 0, 1024, 0)  # v1 B-tree key: size, filter mask, offset
assert raw.count(key) == 1, "badchunk.h5: chunk key not found once"
at = raw.find(key)
raw[at:at + 4] = struct.pack("<I", 0)
open("badchunk.h5", "wb").write(raw)
EOF

W=$WORK
run2() { timeout 60 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 data.val= "$@"; }
expect_error unwritten 2 "^$W/unwritten\.h5: /tokens declares 200000 tokens, but its data was never written \(it would read as zeros\)$" \
  run2 data.train="$W/unwritten.h5"
expect_error missing_chunks 2 "^$W/partchunks\.h5: /tokens declares 200000 tokens in 20 chunks, but only 5 were ever written" \
  run2 data.train="$W/partchunks.h5" data.check_tokens=false
expect_error damaged_chunk_index 2 "^$W/badchunk\.h5: /tokens' [0-9]+ unfiltered chunks of 1024 tokens take [0-9]+ bytes on disk, not [0-9]+ \(a damaged chunk index\)$" \
  run2 data.train="$W/badchunk.h5" data.check_tokens=false
expect_error virtual_dataset 2 "^$W/vds\.h5: /tokens is a virtual dataset" \
  run2 data.train="$W/vds.h5" data.check_tokens=false
expect_error external_link 2 "^$W/extlink\.h5: /tokens is a link to a dataset in another file, .*target\.h5; give that file as the data$" \
  run2 data.train="$W/extlink.h5"
expect_error past_end_of_file 2 "^$W/short\.h5: /tokens declares 200000 tokens at bytes [0-9]+\.\.[0-9]+, but the file ends at byte [0-9]+ \(truncated\)$" \
  run2 data.train="$W/short.h5" data.check_tokens=false
expect_error info_too 2 "^$W/unwritten\.h5: /tokens declares 200000 tokens" "$TESSERA" data info "$W/unwritten.h5"
expect_error eot_outside 2 "^$W/eot_out\.h5: tokenizer eot 300 is not an id of the vocabulary \(0\.\.256\)$" \
  run2 data.train="$W/eot_out.h5"
expect_error eot_negative 2 "^$W/eot_neg\.h5: the eot attribute is -5, not an id of the vocabulary$" \
  run2 data.train="$W/eot_neg.h5"
expect_error unknown_tokenizer 2 "^$W/tok_unknown\.h5: unknown tokenizer 'tiktoken' \(tessera knows byte, sentencepiece, hf-bpe, gpt2, llama3 and none\)$" \
  run2 data.train="$W/tok_unknown.h5"
expect_error vocab_2_32_plus_100 2 "^$W/vocab_huge\.h5: the vocab_size attribute on the root group must be from 1 to 16777216 .*, got 4294967396$" \
  run2 data.train="$W/vocab_huge.h5"

# Paths that are not token files.
mkdir -p adir && mkfifo fifo.h5 && ln -s loop.h5 loop.h5
expect_error data_is_directory 2 "^token file $W/adir is a directory, not a file$" run2 data.train="$W/adir"
expect_error data_is_fifo 2 "^token file $W/fifo\.h5 is a FIFO \(named pipe\), not a file$" run2 data.train="$W/fifo.h5"
expect_error data_is_device 2 "^token file /dev/zero is a character device, not a file$" \
  run2 data.train=/dev/zero data.format=raw model.vocab_size=257
expect_error data_is_link_loop 1 "^cannot read token file $W/loop\.h5: Too many levels of symbolic links \(a symbolic link loop\)$" \
  run2 data.train="$W/loop.h5"
expect_error val_is_fifo 2 "^token file $W/fifo\.h5 is a FIFO \(named pipe\), not a file$" run2 data.val="$W/fifo.h5"

# A chunked file truncated under a running job: the next read stops it, not zeros.
"$TESSERA" train "$deck" data.train="$W/chunked.h5" data.val= train.steps=1000000 log.every=1 \
  run.dir="$W/trunc" >trunc.out 2>trunc.err &
job=$!
for _ in $(seq 600); do [ "$(grep -c '^step' trunc.out)" -ge 5 ] && break; sleep 0.1; done
truncate -s 500000 chunked.h5
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  kill -KILL "$job"
  fail "truncated while read: the run went on (last: $(grep '^step' trunc.out | tail -1))"
else
  wait "$job"
  rc=$?
  if [ "$rc" -eq 1 ] && [ "$(wc -l <trunc.err)" -eq 1 ] &&
     grep -q "^$W/chunked\.h5: the file shrank from [0-9]* to 500000 bytes while it was being read" trunc.err; then
    pass "truncated while read: exit 1 after $(grep -c '^step' trunc.out) steps: $(cat trunc.err)"
  else
    fail "truncated while read: exit $rc"; head -3 trunc.err
  fi
fi
finish
