#!/usr/bin/env bash
# Hugging Face interop without the internet: a random GPT-2 in the HF layout (torch), imported
# (state dict and safetensors), evaluated by tessera against an independent PyTorch forward by
# the HF names; export -> import round trips to the bit; checkpoint.init_from on 1 and 2 ranks;
# every bad input one line, exit 2, nothing written.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/hf_import.sh"
HF="$PYTHON $ROOT/tests/integration/hf_gpt2.py"
test_data
cd "$WORK" || exit 1
$HF make --out hf >/dev/null || { fail "make the random HF GPT-2"; finish; }

deck=$(tiny_deck ft)   # 2 layers, 2 heads, n_embd 32, block 32, T 16, B 4, mb 2, eval.batches 4
# 1. Import the torch state dict against the deck: the model section on stdout.
import_against_deck 'hf-gpt2, 2 layers' '  n_embd: 32' '  vocab_size: 257'

# 2. tessera eval equals the HF forward (float64, written from the HF names) to 1e-5.
got=$(eval_loss imp.h5)
want=$($HF loss --weights hf/pytorch_model.bin --heads 2 --data "$DATA/val.h5" --seq-len 16 --windows 16)
if close "$got" "$want" 1e-5; then
  pass "tessera eval $got equals the HF GPT-2 forward $want (16 windows of 17 tokens)"
else
  fail "tessera eval '$got' vs HF forward '$want'"
fi

# 3. The hub's layout (model.safetensors, no prefix, no head) and a model directory give the
# same checkpoint tensors, bit for bit; F16 and BF16 weights import exactly.
$IMPORT hf --out dir.h5 >/dev/null 2>&1
$IMPORT hf/model.safetensors --out st.h5 --n-head 2 >/dev/null 2>&1
if $HF compare imp.h5 dir.h5 >/dev/null && $HF compare imp.h5 st.h5 >/dev/null; then
  pass "directory, safetensors and torch.load imports equal to the bit"
else
  fail "imports differ: $($HF compare imp.h5 dir.h5) / $($HF compare imp.h5 st.h5)"
fi
for dt in F16 BF16; do
  $HF make --out "hf_$dt" --dtype "$dt" >/dev/null
  $IMPORT "hf_$dt/model.safetensors" --out "$dt.h5" --n-head 2 >/dev/null 2>&1
  $IMPORT "hf_$dt/pytorch_model.bin" --out "${dt}_bin.h5" --n-head 2 >/dev/null 2>&1
  if "$PYTHON" - "$dt.h5" "${dt}_bin.h5" "hf_$dt/pytorch_model.bin" <<'PY'
import sys, h5py, numpy as np, torch
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
sd = torch.load(sys.argv[3])
w = sd["transformer.h.0.attn.c_attn.weight"].float().numpy().T
assert a["model/h.0.attn.c_attn.weight"].dtype == np.float32
assert np.array_equal(a["model/h.0.attn.c_attn.weight"][...], w)
assert np.array_equal(a["model/wte"][:257], sd["transformer.wte.weight"].float().numpy())
assert not a["model/wte"][257:].any()   # padding rows are zeros
for k in a["model"]:
    assert a["model"][k][...].tobytes() == b["model"][k][...].tobytes(), k
PY
  then pass "$dt weights import exactly (safetensors and torch.load alike; padding rows zero)"
  else fail "$dt import"; fi
done

# 4. export -> import round trips: HF -> tessera -> HF equals the original tensors, and
# tessera -> HF -> tessera equals the checkpoint; config.json is GPT2Config's.
if exported imp.h5 <<'PY'
import json, sys, torch
c = json.load(open(sys.argv[2] + "/config.json"))
want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 2,
        "n_embd": 32, "n_positions": 32, "vocab_size": 257, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05, "tie_word_embeddings": True}
assert all(c[k] == v for k, v in want.items()), c
sd = torch.load(sys.argv[2] + "/pytorch_model.bin")
assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()  # tied
import safetensors_io
with safetensors_io.File(sys.argv[2] + "/model.safetensors") as f:
    assert f.metadata == {"format": "pt"}, f.metadata
    assert all(k.startswith("transformer.") for k in f.tensors), list(f.tensors)[:3]
PY
then
  pass "export: model.safetensors and pytorch_model.bin equal the HF originals to the bit; config.json, tied head, format pt"
else
  fail "export"; cat export.log
fi
reimported

# 5. A trained tessera checkpoint -> HF -> tessera: every tensor to the bit (wte's real rows:
# the padding rows are dropped on export), and the same eval loss to the printed digit.
"$TESSERA" train "$deck" train.steps=4 run.dir="$WORK/trained" >trained.log 2>&1 || fail "train"
if trained_round_trip "$WORK/trained/checkpoints" wte:257; then
  pass "trained checkpoint -> export -> import: tensors to the bit, same eval loss"
else
  fail "trained round trip: $(cat trained.cmp)"
fi

# 6. checkpoint.init_from: step 0's val_loss is the imported model's, a fresh optimizer trains
# from it, and 2 ranks (tp=2, and pp=2) give the 1-rank losses.
"$TESSERA" train "$deck" checkpoint.init_from=imp.h5 train.steps=6 >init1.log 2>&1
v0=$(first_val_loss ft/metrics.jsonl)
if grep -q "^init: weights from imp.h5 (step 0" init1.log && grep -q "^step      6/6" init1.log &&
   close "${v0:-nan}" "$got" 1e-5; then
  pass "init_from: step 0 val_loss $v0 = the imported model's eval loss $got; 6 steps trained"
else
  fail "init_from run (val_loss '$v0', eval '$got')"; tail -3 init1.log
fi
# The model is compared as a whole (relative distance 1e-4): the k third of c_attn.bias has no
# gradient in exact arithmetic (softmax ignores a shift of all scores), so a fresh AdamW turns
# each layout's rounding noise there into full-size steps of its own sign.
for layout in "parallel.tp=2" "parallel.pp=2"; do
  name=${layout#parallel.}; name=${name/=/}
  fine_tune "ft_$name" 2 train.steps=6 "$layout"
  if runs_agree ft "ft_$name" 6 --param-norm-tol 1e-4 >cmp.txt 2>&1; then
    pass "init_from on 2 ranks ($layout) = the 1-rank run: $(cat cmp.txt)"
  else
    fail "init_from $layout: $(tail -2 cmp.txt)"; tail -3 "ft_$name.log"
  fi
done
# A requeued fine-tuning job continues its own checkpoint, not the imported weights.
"$TESSERA" train "$deck" checkpoint.init_from=imp.h5 checkpoint.restart=auto train.steps=8 >init2.log 2>&1
if grep -q "^restart: .*step_00000006.h5 at step 6" init2.log && ! grep -q "^init:" init2.log; then
  pass "init_from with a checkpoint of the run in checkpoint.dir: restart wins"
else
  fail "init_from + restart auto"; grep -E "^(init|restart)" init2.log
fi

# 7. checkpoint errors through tessera: one line, exit 2 (1 for a missing file).
expect_error "restart from imported weights" 2 "imp.h5: holds no optimizer state .*checkpoint.init_from" \
  "$TESSERA" train "$deck" checkpoint.restart=imp.h5
expect_error "init_from of another shape" 2 "imp.h5: model shape differs from the deck: model.n_embd 32 in the checkpoint, 64 in the deck" \
  "$TESSERA" train "$deck" checkpoint.init_from=imp.h5 model.n_embd=64
expect_error "init_from of another vocabulary" 2 "imp.h5: model shape differs from the deck: vocab_size 257 in the checkpoint, 300 in the deck" \
  "$TESSERA" train "$deck" checkpoint.init_from=imp.h5 model.vocab_size=300
expect_error "init_from a missing file" 1 "checkpoint.init_from = nothing.h5: no such checkpoint" \
  "$TESSERA" train "$deck" checkpoint.init_from=nothing.h5

# 8. Import errors: one line naming the tensor and the shapes, exit 2, nothing written.
for defect in missing extra shape unknown llama untied int; do
  $HF make --out "bad_$defect" --defect "$defect"
done
import_error "missing tensor" "missing tensor transformer.h.1.mlp.c_fc.weight \[32, 128\]" bad_missing
import_error "extra tensor" "unexpected tensor h.0.attn.c_attn.scale \[3\]" bad_extra
import_error "wrong shape" "transformer.h.0.attn.c_attn.weight is \[96, 32\], .* needs \[32, 96\]" bad_shape
import_error "unknown layout" "unknown layout: none of the known layouts' tensors found" bad_unknown
import_error "a partial LLaMA state dict (recognised as hf-llama)" "bad_llama: missing tensor model.layers.0.self_attn.k_proj.weight \(hf-llama layout\)" bad_llama
import_error "untied head" "lm_head.weight differs from transformer.wte.weight" bad_untied
import_error "integer parameter" "transformer.h.0.ln_1.bias \[32\] is I64, not a floating-point tensor" bad_int
import_error "unknown --layout" "unknown layout 'hf-t5'" hf --layout hf-t5
sed 's/n_embd: 32/n_embd: 64/' "$deck" >deck64.yaml
import_error "deck n_embd" "deck64.yaml: model.n_embd = 64, but hf has n_embd 32 \(transformer.wte.weight \[257, 32\]\)" hf --deck deck64.yaml
sed 's/block_size: 32/block_size: 32\n  vocab_size: 300/' "$deck" >deckv.yaml
import_error "deck vocab" "deckv.yaml: model.vocab_size is 300, but hf has vocab_size 257 \(transformer.wte.weight \[257, 32\]\)" hf --deck deckv.yaml
"$PYTHON" -c 'import json; c=json.load(open("hf/config.json")); c["n_embd"]=48; json.dump(c, open("cfg48.json","w"))'
import_error "config.json disagrees" "config.json n_embd = 48, but the tensors say 32" hf --config cfg48.json
mkdir -p bare && cp hf/model.safetensors bare/
import_error "no heads known" "the number of heads is not in the tensors" bare/model.safetensors
# Malformed safetensors files.
head -c 5 hf/model.safetensors >short.safetensors
import_error "safetensors shorter than 8 bytes" "short.safetensors: 5 bytes: too short" short.safetensors --n-head 2
head -c 1000 hf/model.safetensors >cut.safetensors
import_error "safetensors truncated" "cut.safetensors: .*truncated" cut.safetensors --n-head 2
"$PYTHON" -c 'import struct; h=b"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]"; open("bad_json.safetensors","wb").write(struct.pack("<Q", len(h)) + h + bytes(8))'
import_error "safetensors header not JSON" "bad_json.safetensors: the header is not valid JSON" bad_json.safetensors --n-head 2
"$PYTHON" -c 'import struct; open("huge.safetensors","wb").write(struct.pack("<Q", 1 << 40) + b"{}")'
import_error "safetensors header length" "huge.safetensors: header length 1099511627776 \(bytes 0-7\) exceeds" huge.safetensors --n-head 2
"$PYTHON" -c 'import struct; h=b"{\"wte.weight\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}"; open("badsize.safetensors","wb").write(struct.pack("<Q", len(h)) + h + bytes(12))'
import_error "safetensors size vs shape" "badsize.safetensors: tensor 'wte.weight': data_offsets \[0, 12\] hold 12 bytes, F32 \[2, 2\] needs 16" badsize.safetensors --n-head 2
expect_error "import: a missing source (I/O, exit 1)" 1 "nothing.bin: no such file" \
  $IMPORT nothing.bin --out bad.h5

# 9. Export errors.
mkdir -p exp_bad
export_error "not a checkpoint" "val.h5: not a tessera checkpoint" "$DATA/val.h5"
export_error "unknown format" "unknown layout 'hf-t5'" imp.h5 --format hf-t5
cp imp.h5 corrupt.h5
"$PYTHON" -c 'import h5py; f=h5py.File("corrupt.h5","r+"); d=f["model/h.1.mlp.c_fc.weight"]; d[0,0]+=1'
expect_error "export: checksum" 1 "corrupt.h5: checksum mismatch in /model/h.1.mlp.c_fc.weight" $EXPORT corrupt.h5 --out exp_bad
if [ -z "$(ls -A exp_bad)" ]; then pass "export errors wrote nothing"; else fail "export errors wrote $(ls exp_bad)"; fi
finish
