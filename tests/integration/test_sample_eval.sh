#!/usr/bin/env bash
# `tessera eval` reproduces the validation loss logged in training; `tessera sample` is seeded,
# starts from the prompt and decodes bytes.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck se)
cd "$WORK" || exit 1
"$TESSERA" train "$deck" train.steps=30 eval.batches=6 >train.log 2>&1 || { fail "train"; tail -3 train.log; }
ckpt=$WORK/se/checkpoints
logged=$("$PYTHON" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][-1]["val_loss"])' se/metrics.jsonl)
got=$("$TESSERA" eval "$ckpt" --data "$DATA/val.h5" --batches 6 | sed -n 's/.*loss \([0-9.]*\)$/\1/p')
if "$PYTHON" -c "import sys; a,b=float('$logged'),float('$got'); sys.exit(abs(a-b) > 1e-6*abs(a))"; then
  pass "eval loss $got equals the logged val_loss $logged"
else
  fail "eval loss $got vs logged $logged"
fi
first=$("$PYTHON" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][0]["val_loss"])' se/metrics.jsonl)
if "$PYTHON" -c "import sys; sys.exit(not float('$logged') < float('$first'))"; then
  pass "val_loss fell from $first to $logged"
else
  fail "val_loss did not fall ($first -> $logged)"
fi

"$TESSERA" sample "$ckpt" --prompt "import " --tokens 40 --seed 5 >s1.txt
"$TESSERA" sample "$ckpt" --prompt "import " --tokens 40 --seed 5 >s2.txt
"$TESSERA" sample "$ckpt" --prompt "import " --tokens 40 --seed 6 >s3.txt
if cmp -s s1.txt s2.txt && ! cmp -s s1.txt s3.txt && [ "$(head -c 7 s1.txt)" = "import " ] &&
   [ "$(wc -c <s1.txt)" -gt 8 ]; then
  pass "sample: same seed same text, other seed other text, prompt first"
else
  fail "sample determinism"; od -c s1.txt | head -3
fi
"$TESSERA" sample "$ckpt" --prompt "x" --tokens 30 --temperature 0 --seed 1 >g1.txt
"$TESSERA" sample "$ckpt" --prompt "x" --tokens 30 --temperature 0 --seed 2 >g2.txt
if cmp -s g1.txt g2.txt; then pass "greedy sampling ignores the seed"; else fail "greedy sampling"; fi
if [ "$("$TESSERA" sample "$ckpt" --prompt "abc" --tokens 0)" = "abc" ]; then
  pass "--tokens 0 prints the prompt alone"
else
  fail "--tokens 0"
fi
# eval compares the tokenizers as train does: a byte-level checkpoint on a GPT-2 llm.c shard
# (whose ids happen to be below 257) is refused, not given a loss.
"$PYTHON" - "$WORK/gpt2_shard.bin" <<'EOF'
import sys
import numpy as np
header = np.zeros(256, dtype=np.int32)
header[:3] = [20240520, 1, 4096]
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write((np.arange(4096) % 200).astype(np.uint16).tobytes())
EOF
expect_error eval_other_tokenizer 2 "^tessera eval: --data $WORK/gpt2_shard\.bin has tokenizer 'gpt2' \(vocab_size 50257.*\), the checkpoint $ckpt/step_00000030\.h5 has 'byte' \(vocab_size 257.*\): their vocabularies differ$" \
  "$TESSERA" eval "$ckpt" --data "$WORK/gpt2_shard.bin"
# A checkpoint whose stored deck text is garbage, its tensors intact: evaluated with the default
# deck, saying so.
cp "$ckpt/step_00000030.h5" garbage_deck.h5
"$PYTHON" -c 'import h5py, sys
with h5py.File(sys.argv[1], "r+") as f: f.attrs["deck"] = "model: [\x01 {{{ garbage"' garbage_deck.h5
if "$TESSERA" eval garbage_deck.h5 --data "$DATA/val.h5" --batches 2 >gd.out 2>gd.err &&
   grep -q "^eval: warning: the deck stored in garbage_deck\.h5 cannot be read (.*): evaluating with the default deck, seq_len 32, batch_size [0-9]*$" gd.out &&
   grep -Eq "^eval: garbage_deck\.h5 \(step 30\) on .*: loss [0-9]+\.[0-9]+$" gd.out && [ ! -s gd.err ]; then
  pass "eval of a checkpoint with a garbage deck: $(tail -1 gd.out)"
else
  fail "eval of a checkpoint with a garbage deck"; cat gd.out gd.err | head -4
fi
finish
