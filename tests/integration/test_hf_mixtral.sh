#!/usr/bin/env bash
# Hugging Face Mixtral interop without the internet (the hf-mixtral layout): a random
# MixtralForCausalLM (3 layers of 4 experts, top 2, grouped-query attention, untied) imported
# into tessera's model.moe, tessera's eval loss against an independent PyTorch forward of
# Mixtral's sparse MoE block; export -> import round trips to the bit, every config.json key
# back; a trained tessera MoE model out and in again; every bad input one line, exit 2, nothing
# written; a Qwen3-MoE not taken for a Mixtral (test_hf_qwen_moe.sh imports it).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/hf_import.sh"
HF="$PYTHON $ROOT/tests/integration/hf_mixtral.py"
test_data
cd "$WORK" || exit 1
# 3 layers, 4 heads on 2 key/value heads, n_embd 32, 4 experts of width 24, top 2, 64 positions,
# vocab 257, untied; rms_norm_eps 1e-6, rope_theta 2000, router_aux_loss_coef 0.02.
$HF make --out hf >/dev/null || { fail "make the random HF Mixtral"; finish; }
# A Qwen3-MoE of the same size (hf_qwen_moe.py's, every layer sparse), and its weights alone,
# without config.json: neither is a Mixtral.
$PYTHON "$ROOT/tests/integration/hf_qwen_moe.py" make --out hf/qwen3_moe --dense 0 >/dev/null &&
  mkdir -p hf/qwen3_moe_bare && cp hf/qwen3_moe/model.safetensors hf/qwen3_moe_bare/ ||
  { fail "make the random HF Qwen3-MoE"; finish; }

deck=$WORK/mixtral.yaml
hf_deck "$deck" 3.0e-3 <<'MODEL'
model:
  arch: llama
  n_layer: 3
  n_head: 4
  n_kv_head: 2
  n_embd: 32
  ffn_hidden: 24
  block_size: 64
  norm_eps: 1.0e-6
  rope_theta: 2000.0
  moe:
    experts: 4
    top_k: 2
    ffn: 24
MODEL

# 1. Import against the deck: the model section, model.moe included, on stdout. Mixtral's
# router_aux_loss_coef 0.02 is one loss over all 3 layers, 2 choices a token: 0.02 x 2 / 3 a layer.
import_against_deck 'hf-mixtral, 3 layers, 4 heads (2 key/value), 4 experts (top 2) of width 24' \
  '  arch: llama' '  ffn_hidden: 24' '  moe:' '    experts: 4' '    top_k: 2' '    ffn: 24' \
  '    score: softmax' '    renormalize: true' '    aux_loss: 0.0133333333333'

# 2. tessera eval equals Mixtral's forward (float64, by the HF names) to 1e-5; the same weights
# with each expert's w1 and w3 exchanged give another loss, so gate and up taken the wrong way
# round would have been caught.
got=$(eval_loss imp.h5)
read -r want swapped <<<"$($HF loss --weights hf/pytorch_model.bin --config hf/config.json \
  --data "$DATA/val.h5" --seq-len 16 --windows 16 --swap-gate-up | tr '\n' ' ')"
if close "$got" "$want" 1e-5; then
  pass "tessera eval $got equals the HF Mixtral forward $want (16 windows of 17 tokens, 4 experts top 2, GQA)"
else
  fail "tessera eval '$got' vs HF forward '$want'"
fi
if ! close "$got" "$swapped" 1e-3; then
  pass "w1 and w3 exchanged would give $swapped: the gate and up rows are told apart"
else
  fail "exchanging w1 and w3 does not change the loss ($swapped): the test cannot tell"
fi

# 3. A model directory (its deck made from config.json) and the bare safetensors with --deck (no
# config.json) give the same tensors and /model attributes; the made deck evaluates.
same_imports "directory, bare safetensors (--deck) and torch.load imports equal to the bit; the made deck evaluates" \
  evaluate <<'PY'
import sys, h5py, yaml
a, b = (h5py.File(p, "r")["model"].attrs for p in sys.argv[1:3])
assert all(a[k] == b[k] for k in a) and set(a) == set(b), {k: (a[k], b.get(k)) for k in a}
assert (a["moe_experts"], a["moe_top_k"], a["moe_ffn"], a["moe_every"], a["moe_first_dense"]) == (4, 2, 24, 1, 0)
moe = yaml.safe_load(h5py.File(sys.argv[3], "r").attrs["deck"])["model"]["moe"]
assert moe == {"experts": 4, "top_k": 2, "ffn": 24, "every": 1, "first_dense": 0,
               "score": "softmax", "renormalize": True, "aux_loss": 0.0133333333333}, moe
PY

# 4. HF -> tessera (the deck made from config.json) -> HF gives every tensor back to the bit, and
# config.json every key of the original (MixtralConfig's; router_aux_loss_coef 0.02 through
# tessera's 0.0133333333333; imp.h5's --deck has aux_loss 0.01, section 5's number).
if exported dir.h5 <<'PY'
import json, sys
a, b = (json.load(open(d + "/config.json")) for d in sys.argv[1:])
assert all(b.get(k, "absent") == v for k, v in a.items()), {k: (v, b.get(k)) for k, v in a.items() if b.get(k) != v}
import safetensors_io
with safetensors_io.File(sys.argv[2] + "/model.safetensors") as f:
    assert f.metadata == {"format": "pt"}, f.metadata
    assert f.tensors["model.layers.2.block_sparse_moe.experts.3.w2.weight"].shape == (32, 24)
    assert len(f.tensors) == 2 + 3 * (7 + 3 * 4) + 1
PY
then
  pass "export: model.safetensors and pytorch_model.bin equal the HF originals to the bit; config.json's $(wc -w <hf/config.json) words' keys all back"
else
  fail "export"; cat export.log
fi
transformers_loads MixtralForCausalLM
reimported

# 5. A trained tessera MoE checkpoint -> HF -> tessera: every tensor to the bit and the same eval
# loss; checkpoint.init_from starts from the import at its eval loss.
"$TESSERA" train "$deck" run.dir="$WORK/trained" >trained.log 2>&1 || fail "train"
if trained_round_trip "$WORK/trained/checkpoints" embed_tokens.weight:257 lm_head.weight:257 &&
   grep -q '"router_aux_loss_coef": 0.015' exp_trained/config.json; then
  pass "trained MoE checkpoint -> export -> import: tensors to the bit, same eval loss; aux_loss 0.01 out as router_aux_loss_coef 0.015"
else
  fail "trained round trip: $(cat trained.cmp)"
fi
"$TESSERA" train "$deck" checkpoint.init_from=imp.h5 train.steps=2 >init.log 2>&1
v0=$(first_val_loss ft/metrics.jsonl)
if grep -q "^init: weights from imp.h5 (step 0" init.log && close "${v0:-nan}" "$got" 1e-5; then
  pass "init_from: step 0 val_loss $v0 = the imported model's eval loss"
else
  fail "init_from run (val_loss '$v0', eval '$got')"; tail -3 init.log
fi

# 6. Import errors: one line naming the tensor or key and the numbers, exit 2, nothing written.
import_error "config.json's expert count" "hf/bad/experts_config: config.json num_local_experts = 8, but model.layers.0.block_sparse_moe.gate.weight \[4, 32\] routes to 4 experts" hf/bad/experts_config
import_error "a router of another shape" "hf/bad/router_shape: model.layers.1.block_sparse_moe.gate.weight is \[3, 32\], the hf-mixtral layout with .*4 experts of width 24 needs \[4, 32\]" hf/bad/router_shape
import_error "an expert missing" "hf/bad/expert_missing: model.layers.0.block_sparse_moe.gate.weight \[4, 32\] routes to 4 experts, but layer 0 has the tensors of experts 0 .. 2" hf/bad/expert_missing
import_error "an expert too many" "hf/bad/expert_extra: unexpected tensor layers.1.block_sparse_moe.experts.4.w1.weight \[24, 32\]: not part of the hf-mixtral layout with n_layer 3, 4 experts of width 24" hf/bad/expert_extra
import_error "an expert's w3 wider" "hf/bad/w3_shape: model.layers.1.block_sparse_moe.experts.2.w3.weight is \[25, 32\], .* needs \[24, 32\]" hf/bad/w3_shape
import_error "num_experts_per_tok above the experts" "hf/bad/top_k: num_experts_per_tok = 5 \(config.json num_experts_per_tok\): must be 1 .. num_local_experts = 4" hf/bad/top_k
import_error "a sliding window" "hf/bad/sliding_window: config.json sliding_window = 16: tessera's attention sees the whole sequence" hf/bad/sliding_window
sed 's/experts: 4/experts: 8/' "$deck" >deck_e8.yaml
import_error "deck model.moe.experts" "deck_e8.yaml: model.moe.experts = 8, but hf has 4 experts \(config.json num_local_experts, model.layers.0.block_sparse_moe.gate.weight \[4, 32\]\)" hf --deck deck_e8.yaml
sed 's/top_k: 2/top_k: 1/' "$deck" >deck_k1.yaml
import_error "deck model.moe.top_k" "deck_k1.yaml: model.moe.top_k = 1, but hf has top_k 2 \(config.json num_experts_per_tok\)" hf --deck deck_k1.yaml
sed 's/ffn: 24/ffn: 32/' "$deck" >deck_ffn.yaml
import_error "deck model.moe.ffn" "deck_ffn.yaml: model.moe.ffn = 32, but hf has ffn 24 \(model.layers.0.block_sparse_moe.experts.0.w1.weight \[24, 32\]\)" hf --deck deck_ffn.yaml
sed 's/ffn: 24/ffn: 24\n    score: sigmoid/' "$deck" >deck_sigmoid.yaml
import_error "deck model.moe.score" "deck_sigmoid.yaml: model.moe.score = sigmoid, but MixtralForCausalLM routes with score softmax" hf --deck deck_sigmoid.yaml
sed '/^  moe:$/,/^    ffn: 24$/d' "$deck" >deck_dense.yaml
import_error "a dense deck" "deck_dense.yaml: model.moe.experts = 0, but hf has 4 experts" hf --deck deck_dense.yaml
# A Qwen3-MoE is not a Mixtral: its config.json says so, and without one its q_norm tensors
# make it hf-qwen3-moe, whose q/k norms this deck (model.qk_norm false) does not have.
import_error "Qwen3-MoE as hf-mixtral" "hf/qwen3_moe/config.json: model_type 'qwen3_moe', but the layout is hf-mixtral \(mixtral\)" hf/qwen3_moe --layout hf-mixtral
import_error "Qwen3-MoE without config.json, Mixtral's deck" "mixtral.yaml: model.qk_norm = false, but hf/qwen3_moe_bare/model.safetensors has qk_norm true \(model.layers.0.self_attn.q_norm.weight \[8\]\)" hf/qwen3_moe_bare/model.safetensors --deck "$deck"

# 7. Export errors: a model Mixtral cannot hold; nothing written.
mkdir -p exp_bad
export_error "an MoE model as hf-llama" "imp.h5: a mixture-of-experts model \(4 experts\): the hf-llama layout \(LlamaForCausalLM\) has none" \
  imp.h5 --format hf-llama
"$TESSERA" train "$deck" train.steps=0 model.moe.every=2 run.dir="$WORK/every2" >every2.log 2>&1
export_error "MoE every second layer" "step_00000000.h5: model.moe.every 2 and first_dense 0 leave dense layers: MixtralForCausalLM routes every layer through experts" \
  "$WORK/every2/checkpoints"
"$TESSERA" train "$deck" train.steps=0 model.moe.score=sigmoid run.dir="$WORK/sigmoid" >sigmoid.log 2>&1
export_error "sigmoid scores" "step_00000000.h5: the deck's model.moe.score is 'sigmoid': MixtralForCausalLM routes with score 'softmax'" \
  "$WORK/sigmoid/checkpoints"
"$TESSERA" train deck_dense.yaml train.steps=0 run.dir="$WORK/dense" >dense.log 2>&1
export_error "a dense LLaMA as hf-mixtral" "step_00000000.h5: a dense model: the hf-mixtral layout \(MixtralForCausalLM\) has experts in every layer" \
  "$WORK/dense/checkpoints" --format hf-mixtral
"$TESSERA" train "$(tiny_deck gpt2moe)" train.steps=0 model.moe.experts=4 >gpt2moe.log 2>&1
export_error "a GPT-2 with experts" "step_00000000.h5: a gpt2 model with 4 experts: no export format holds it" \
  "$WORK/gpt2moe/checkpoints"
if [ -z "$(ls -A exp_bad)" ]; then pass "export errors wrote nothing"; else fail "export errors wrote $(ls exp_bad)"; fi
finish
