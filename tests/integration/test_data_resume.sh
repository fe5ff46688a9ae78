#!/usr/bin/env bash
# Exact data resume, shown on the token ids each step consumes (data.trace writes them): a run
# stopped and restarted on the same layout replays exactly the batches of an uninterrupted run,
# and a restart on a different dp size continues the same global sequence; for one source and for
# a blend of two. The traced ids are the file's own (checked against h5py), and a blend draws from
# both sources in a sequence fixed by the seed.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck resume)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
test_data
single="$DATA/train.h5"
blend="0.7 $DATA/train.h5 0.3 $DATA/val.h5"

# run NAME NP DP STEPS DATA [OVERRIDES...]: train (restarting from NAME's checkpoint if any).
run() {
  local name=$1 np=$2 dp=$3 steps=$4 data=$5
  shift 5
  timeout 120 $MPIEXEC -n "$np" "$TESSERA" train "$deck" data.trace=true data.val= parallel.dp="$dp" \
    train.steps="$steps" train.batch_size=8 train.micro_batch=2 model.vocab_size=257 \
    checkpoint.restart=auto run.dir="$WORK/$name" data.train="$data" "$@" >>"$name.log" 2>&1 ||
    { fail "$name: training exited $?"; tail -3 "$name.log"; }
}
# The union of every rank's trace, one line per sample, sorted by global sample index.
trace() { cat "$WORK/$1"/data_trace.rank*.txt | sort -k2,2n -k1,1n; }

for kind in single blend; do
  data=$single; [ $kind = blend ] && data=$blend
  run "${kind}_straight" 2 2 8 "$data"
  run "${kind}_same" 2 2 4 "$data"
  run "${kind}_same" 2 2 8 "$data"
  run "${kind}_cross" 2 2 4 "$data"
  run "${kind}_cross" 1 1 8 "$data"
  trace "${kind}_straight" >"${kind}_straight.txt"
  n=$(wc -l <"${kind}_straight.txt")
  if [ "$n" -eq 64 ]; then pass "$kind: 8 steps x 8 samples traced"; else fail "$kind: $n trace lines, want 64"; fi
  for how in same cross; do
    trace "${kind}_$how" >"${kind}_$how.txt"
    if [ "$n" -eq 64 ] && cmp -s "${kind}_straight.txt" "${kind}_$how.txt"; then
      pass "$kind: restart ($how) consumed the same token ids in every step as the straight run"
    else
      fail "$kind: restart ($how) read other tokens"; diff "${kind}_straight.txt" "${kind}_$how.txt" | head -4 | cut -c1-150
    fi
  done
  grep -q "restart: data resumes at global sample 32 (epoch" "${kind}_cross.log" &&
    pass "$kind: restart log: $(grep 'data resumes' "${kind}_cross.log" | tail -1)" ||
    fail "$kind: no data position in the restart log"
done

# The traced ids are the file's tokens of the traced window; the blend uses both sources, about
# 7:3; another seed gives another sequence; the checkpoint records the data position.
"$PYTHON" - "$DATA/train.h5" single_straight.txt blend_straight.txt "$WORK/blend_straight/checkpoints" <<'EOF' && pass "trace ids = h5py windows; blend of both sources; checkpoint data position" || fail "trace or checkpoint content"
import glob, sys, h5py
tokens = h5py.File(sys.argv[1])["tokens"]
T = 16
for line in open(sys.argv[2]):
    head, ids = line.split(":")
    step, g, source, window = map(int, head.split())
    want = list(tokens[window * T: window * T + T + 1])
    assert list(map(int, ids.split())) == want, (g, window)
sources = [int(l.split()[2]) for l in open(sys.argv[3])]
share = sources.count(0) / len(sources)
assert set(sources) == {0, 1} and 0.5 < share < 0.9, share
ck = h5py.File(sorted(glob.glob(sys.argv[4] + "/step_*.h5"))[-1])
assert ck["train"].attrs["next_sample"] == 64
assert "train.h5 (hdf5, " in ck["train"].attrs["data_sources"].decode()
assert "epoch" in ck["train"].attrs["data_position"].decode()
print("source 0 share %.2f of %d samples" % (share, len(sources)))
EOF
# The blend order against its Python specification (tools/data/tessera_data.py blend).
nt=$("$PYTHON" -c 'import h5py,sys; print((h5py.File(sys.argv[1])["tokens"].shape[0] - 1) // 16)' "$DATA/train.h5")
nv=$("$PYTHON" -c 'import h5py,sys; print((h5py.File(sys.argv[1])["tokens"].shape[0] - 1) // 16)' "$DATA/val.h5")
"$PYTHON" "$ROOT/tools/data/tessera_data.py" blend --weights 0.7,0.3 --windows "$nt,$nv" --seed 7 --count 64 >py_blend.txt
cut -d: -f1 blend_straight.txt | cut -d' ' -f2- >cpp_blend.txt
if [ -s py_blend.txt ] && cmp -s py_blend.txt cpp_blend.txt; then
  pass "blend: the 64 traced (sample, source, window) equal tools/data/tessera_data.py's specification"
else
  fail "blend order differs from tools/data/tessera_data.py"; diff py_blend.txt cpp_blend.txt | head -4
fi
run other_seed 1 1 2 "$blend" train.seed=8
head -16 blend_straight.txt | cut -d: -f1 | cut -d' ' -f2- >a.txt
trace other_seed | cut -d: -f1 | cut -d' ' -f2- >b.txt
if [ -s b.txt ] && ! cmp -s a.txt b.txt; then pass "another seed draws another blend sequence"
else fail "seed 8 drew the same blend sequence as seed 7"; fi
finish
