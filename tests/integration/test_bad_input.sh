#!/usr/bin/env bash
# Bad data files, checkpoints and command lines: one clear line naming the file and the value,
# exit 2 (bad input) or 1 (I/O), and nothing half-written.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck bad)
cd "$WORK" || exit 1

# Token files the tests need: not HDF5, HDF5 without /tokens, ids past the declared vocabulary,
# and one too short for a single window.
"$PYTHON" - <<'EOF'
import h5py, numpy as np
open("junk.h5", "w").write("this is not HDF5\n")
with h5py.File("notokens.h5", "w") as f:
    f["other"] = np.arange(10)
def tokens(path, ids, vocab):
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.array(ids, dtype=np.uint16))
        f.attrs["vocab_size"] = np.int64(vocab)
        f.attrs["eot"] = np.int64(vocab - 1)
        f.attrs["tokenizer"] = np.bytes_("byte")
tokens("badid.h5", [1, 2, 3] * 200 + [60] + [4] * 100, 50)
tokens("short.h5", [1, 2, 3], 50)
EOF

expect_error missing_data 1 "cannot read token file $WORK/none\.h5" \
  "$TESSERA" train "$deck" data.train="$WORK/none.h5"
expect_error not_hdf5 2 "$WORK/junk\.h5: not a token file tessera recognises" \
  "$TESSERA" train "$deck" data.train="$WORK/junk.h5"
expect_error no_tokens 2 "$WORK/notokens\.h5: no /tokens dataset" \
  "$TESSERA" train "$deck" data.train="$WORK/notokens.h5"
expect_error vocab_too_small 2 "tokenizer vocab_size 257 exceeds model\.vocab_size 100" \
  "$TESSERA" train "$deck" model.vocab_size=100
expect_error short_data 2 "$WORK/short\.h5: 3 tokens hold no window" \
  "$TESSERA" train "$deck" data.train="$WORK/short.h5" data.val=
expect_error token_id_over_vocab 2 "$WORK/badid\.h5: token 600 \($WORK/badid\.h5 at byte [0-9]+\) has id 60, not below the model's vocab_size 50" \
  "$TESSERA" train "$deck" data.train="$WORK/badid.h5" data.val= train.steps=400 run.dir="$WORK/badid"
if ls "$WORK/badid/checkpoints/"* >/dev/null 2>&1; then fail "a failed run left checkpoint files"; else pass "failed run wrote no checkpoint"; fi

# Checkpoints: a good one, then restarts and tools that must refuse.
"$TESSERA" train "$deck" train.steps=2 >good.log 2>&1 || { fail "training a checkpoint"; tail -3 good.log; }
ckpt=$WORK/bad/checkpoints/step_00000002.h5
expect_error ckpt_shape 2 "step_00000002\.h5: model shape differs from the deck: model\.n_layer 2 in the checkpoint, 3 in the deck" \
  "$TESSERA" train "$deck" model.n_layer=3 checkpoint.restart="$ckpt" run.dir="$WORK/shape"
expect_error ckpt_missing 1 "checkpoint\.restart = $WORK/gone\.h5: no such checkpoint" \
  "$TESSERA" train "$deck" checkpoint.restart="$WORK/gone.h5"
expect_error ckpt_not_hdf5 2 "$WORK/junk\.h5: not an HDF5 file" \
  "$TESSERA" train "$deck" checkpoint.restart="$WORK/junk.h5"
expect_error ckpt_not_tessera 2 "$WORK/notokens\.h5: not a tessera checkpoint" \
  "$TESSERA" sample "$WORK/notokens.h5"
expect_error sample_missing 1 "cannot read checkpoint $WORK/gone\.h5" "$TESSERA" sample "$WORK/gone.h5"
expect_error eval_missing_data 1 "cannot read token file $WORK/none\.h5" \
  "$TESSERA" eval "$ckpt" --data "$WORK/none.h5"
expect_error eval_no_data_flag 2 "--data FILE is required" "$TESSERA" eval "$ckpt"
expect_error sample_bad_flag 2 "--tokens: expected an integer" "$TESSERA" sample "$ckpt" --tokens many
expect_error sample_unknown_flag 2 "unknown option --top-k" "$TESSERA" sample "$ckpt" --top-k 5
if ls "$WORK"/*/checkpoints/*.tmp >/dev/null 2>&1 || [ -e "$WORK/shape/checkpoints" ]; then
  fail "a failed command left files behind"
else
  pass "no .tmp or stray checkpoint left by the failures"
fi
finish
