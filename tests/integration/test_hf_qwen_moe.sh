#!/usr/bin/env bash
# Hugging Face Qwen3-MoE interop without the internet (the hf-qwen3-moe layout): a random
# Qwen3MoeForCausalLM (3 layers, the first dense by mlp_only_layers, then 4 experts top 2 without
# norm_topk_prob; grouped-query attention with Qwen3's per-head q and k norms; untied) imported
# into tessera's model.qk_norm and model.moe, tessera's eval loss against an independent PyTorch
# forward written from Qwen3-MoE's published conventions (tests/integration/hf_qwen_moe.py);
# export -> import round trips to the bit, every config.json key back; the import trained at 1
# rank and at tp 2 and ep 2 alike; a trained model out and in again; every bad input one line,
# exit 2, nothing written.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/hf_import.sh"
HF="$PYTHON $ROOT/tests/integration/hf_qwen_moe.py"
test_data
cd "$WORK" || exit 1
# 3 layers, 4 heads on 2 key/value heads, n_embd 32 (head_dim 8), the dense MLP 40 wide, 4 experts
# of width 24, top 2, 64 positions, vocab 257, untied; rms_norm_eps 1e-6, rope_theta 2000,
# norm_topk_prob false, router_aux_loss_coef 0.02.
$HF make --out hf >/dev/null || { fail "make the random HF Qwen3-MoE"; finish; }

deck=$WORK/qwen.yaml
hf_deck "$deck" 1.0e-3 "eps: 1.0e-6" <<'MODEL'
model:
  arch: llama
  n_layer: 3
  n_head: 4
  n_kv_head: 2
  n_embd: 32
  ffn_hidden: 40
  block_size: 64
  norm_eps: 1.0e-6
  rope_theta: 2000.0
  qk_norm: true
  moe:
    experts: 4
    top_k: 2
    ffn: 24
    first_dense: 1
    renormalize: false
MODEL

# 1. Import against the deck: the model section, q/k norms and model.moe included, on stdout.
# Qwen3-MoE's router_aux_loss_coef 0.02 is one loss over its 2 MoE layers, 2 choices a token:
# 0.02 x 2 / 2 a layer.
import_against_deck 'hf-qwen3-moe, 3 layers, 4 heads (2 key/value), 4 experts (top 2) of width 24' \
  '  arch: llama' '  ffn_hidden: 40' '  qk_norm: true' '    experts: 4' '    ffn: 24' \
  '    first_dense: 1' '    every: 1' '    renormalize: false' '    aux_loss: 0.02'

# 2. tessera eval equals Qwen3-MoE's forward (float64, by the HF names) to 1e-5; the forward with
# one convention wrong (no q/k norms, norm_topk_prob flipped, gate and up exchanged) gives
# another loss each, so an import or a model that got it wrong would have been caught.
got=$(eval_loss imp.h5)
read -r want no_qk renorm swapped <<<"$($HF loss --weights hf/pytorch_model.bin --config hf/config.json \
  --data "$DATA/val.h5" --seq-len 16 --windows 16 --variants | tr '\n' ' ')"
if close "$got" "$want" 1e-5; then
  pass "tessera eval $got equals the HF Qwen3-MoE forward $want (16 windows of 17 tokens, q/k norms, a dense layer, 4 experts top 2)"
else
  fail "tessera eval '$got' vs HF forward '$want'"
fi
if ! close "$got" "$no_qk" 5e-4 && ! close "$got" "$renorm" 5e-4 && ! close "$got" "$swapped" 5e-4; then
  pass "without q/k norms $no_qk, norm_topk_prob flipped $renorm, gate and up exchanged $swapped: each convention is told apart"
else
  fail "a convention the test cannot tell ($no_qk, $renorm, $swapped)"
fi

# 3. A model directory (its deck made from config.json) and the bare safetensors with --deck (no
# config.json) give the same tensors and /model attributes; the made deck evaluates.
same_imports "directory, bare safetensors (--deck) and torch.load imports equal to the bit; the made deck evaluates" \
  evaluate <<'PY'
import sys, h5py, yaml
a, b = (h5py.File(p, "r")["model"].attrs for p in sys.argv[1:3])
assert all(a[k] == b[k] for k in a) and set(a) == set(b), {k: (a[k], b.get(k)) for k in a}
assert (a["qk_norm"], a["moe_experts"], a["moe_top_k"], a["moe_ffn"], a["moe_every"],
        a["moe_first_dense"], a["ffn_hidden"]) == (1, 4, 2, 24, 1, 1, 40)
model = yaml.safe_load(h5py.File(sys.argv[3], "r").attrs["deck"])["model"]
assert model["qk_norm"] is True, model
assert model["moe"] == {"experts": 4, "top_k": 2, "ffn": 24, "every": 1, "first_dense": 1,
                        "score": "softmax", "renormalize": False, "aux_loss": 0.02}, model["moe"]
PY

# 4. HF -> tessera (the deck made from config.json) -> HF gives every tensor back to the bit, and
# config.json every key of the original (Qwen3MoeConfig's; mlp_only_layers [0] through
# first_dense 1, norm_topk_prob false through renormalize, router_aux_loss_coef 0.02 through
# aux_loss 0.02).
if exported dir.h5 <<'PY'
import json, sys
a, b = (json.load(open(d + "/config.json")) for d in sys.argv[1:])
assert all(b.get(k, "absent") == v for k, v in a.items()), {k: (v, b.get(k)) for k, v in a.items() if b.get(k) != v}
import safetensors_io
with safetensors_io.File(sys.argv[2] + "/model.safetensors") as f:
    assert f.metadata == {"format": "pt"}, f.metadata
    assert f.tensors["model.layers.2.mlp.experts.3.down_proj.weight"].shape == (32, 24)
    assert f.tensors["model.layers.0.mlp.gate_proj.weight"].shape == (40, 32)
    assert f.tensors["model.layers.1.self_attn.k_norm.weight"].shape == (8,)
    assert len(f.tensors) == 2 + 3 * 8 + 3 + 2 * (1 + 3 * 4) + 1
PY
then
  pass "export: model.safetensors and pytorch_model.bin equal the HF originals to the bit; config.json's $(wc -w <hf/config.json) words' keys all back"
else
  fail "export"; cat export.log
fi
reimported

# 5. Fine-tuning the import: 4 steps at 1 rank, and at tp 2 (each rank half the heads: the q/k
# norms' gradients summed over tp; with sequence parallelism too) and ep 2 (2 experts a rank),
# the same losses to 1e-5 and tensors to 1e-4 of their largest; step 0's validation loss is the
# import's eval loss. (optim.lr 1e-3: at 3e-3 this random model's third step has a gradient norm
# of 76, and fp32's rounding of the tp split, 1e-8 on the first steps, grows there to 1e-5.) The
# trained checkpoint -> HF -> tessera: every tensor to the bit, the same eval loss.
export OMP_NUM_THREADS=1
fine_tune one 1
v0=$(first_val_loss one/metrics.jsonl)
if grep -q "^init: weights from imp.h5 (step 0" one.log && close "${v0:-nan}" "$got" 1e-5; then
  pass "init_from: step 0 val_loss $v0 = the imported model's eval loss"
else
  fail "init_from run (val_loss '$v0', eval '$got')"; tail -3 one.log
fi
for layout in "tp2 parallel.dp=1 parallel.tp=2" "ep2 parallel.dp=2 parallel.ep=2" \
              "tp2_sp parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true"; do
  set -- $layout
  name=$1
  shift
  if fine_tune "$name" 2 "$@" && out=$(runs_agree one "$name" 4 --steps 1:4); then
    pass "fine-tune at $*: $out"
  else
    fail "fine-tune at $*: ${out:-}"; tail -3 "$name.log"
  fi
done
if trained_round_trip "$WORK/one/checkpoints" embed_tokens.weight:257 lm_head.weight:257 &&
   grep -q '"router_aux_loss_coef": 0.01' exp_trained/config.json &&
   grep -q '"mlp_only_layers": \[$' exp_trained/config.json &&
   grep -q '"norm_topk_prob": false' exp_trained/config.json; then
  pass "trained checkpoint -> export -> import: tensors to the bit, same eval loss; aux_loss 0.01 out as router_aux_loss_coef 0.01"
else
  fail "trained round trip: $(cat trained.cmp)"
fi

# 6. Import errors: one line naming the key or tensor and the numbers, exit 2, nothing written.
import_error "config.json's expert count" "hf/bad/experts_config: config.json num_experts = 8, but model.layers.1.mlp.gate.weight \[4, 32\] routes to 4 experts" hf/bad/experts_config
import_error "a router of another shape" "hf/bad/router_shape: model.layers.2.mlp.gate.weight is \[3, 32\], the hf-qwen3-moe layout with .*4 experts of width 24 needs \[4, 32\]" hf/bad/router_shape
import_error "head_dim apart from hidden / heads" "hf/bad/head_dim: config.json head_dim = 16: tessera's head size is hidden_size / num_attention_heads = 32 / 4 = 8" hf/bad/head_dim
import_error "mlp_only_layers not a prefix" "hf/bad/mlp_only: config.json mlp_only_layers = \[1\]: tessera's dense layers are the first model.moe.first_dense ones" hf/bad/mlp_only
import_error "a sliding window" "hf/bad/sliding_window: config.json use_sliding_window = true \(sliding_window 16\): tessera's attention sees the whole sequence" hf/bad/sliding_window
import_error "attention biases" "hf/bad/attention_bias: config.json attention_bias = true: tessera's LLaMA has no biases" hf/bad/attention_bias
sed 's/experts: 4/experts: 8/' "$deck" >deck_e8.yaml
import_error "deck model.moe.experts" "deck_e8.yaml: model.moe.experts = 8, but hf has 4 experts \(config.json num_experts, model.layers.1.mlp.gate.weight \[4, 32\]\)" hf --deck deck_e8.yaml
import_error "deck model.moe.experts, no config.json" "deck_e8.yaml: model.moe.experts = 8, but bare/model.safetensors has 4 experts \(model.layers.1.mlp.gate.weight \[4, 32\]\)" bare/model.safetensors --deck deck_e8.yaml
sed 's/qk_norm: true/qk_norm: false/' "$deck" >deck_noqk.yaml
import_error "deck without q/k norms" "deck_noqk.yaml: model.qk_norm = false, but hf has qk_norm true \(model.layers.0.self_attn.q_norm.weight \[8\]\)" hf --deck deck_noqk.yaml
sed 's/renormalize: false/renormalize: true/' "$deck" >deck_renorm.yaml
import_error "deck model.moe.renormalize" "deck_renorm.yaml: model.moe.renormalize = true, but hf has renormalize false \(config.json norm_topk_prob\)" hf --deck deck_renorm.yaml
sed 's/first_dense: 1/first_dense: 0/' "$deck" >deck_fd0.yaml
import_error "deck model.moe.first_dense" "deck_fd0.yaml: model.moe.first_dense = 0, but hf has first_dense 1 \(config.json decoder_sparse_step, mlp_only_layers\)" hf --deck deck_fd0.yaml

# 7. Export errors: a model Qwen3-MoE (or Mixtral, or LLaMA) cannot hold; nothing written.
mkdir -p exp_bad
export_error "q/k norms as hf-mixtral" "imp.h5: q/k norms \(model.qk_norm\): the hf-mixtral layout \(MixtralForCausalLM\) has none" \
  imp.h5 --format hf-mixtral
"$TESSERA" train "$deck" train.steps=0 model.qk_norm=false run.dir="$WORK/noqk" >noqk.log 2>&1
export_error "no q/k norms as hf-qwen3-moe" "step_00000000.h5: no q/k norms \(model.qk_norm false\): the hf-qwen3-moe layout \(Qwen3MoeForCausalLM\) normalises each head's q and k" \
  "$WORK/noqk/checkpoints" --format hf-qwen3-moe
sed '/^  moe:$/,/^    renormalize: false$/d' "$deck" >deck_dense.yaml
"$TESSERA" train deck_dense.yaml train.steps=0 run.dir="$WORK/dense" >dense.log 2>&1
export_error "a dense LLaMA with q/k norms" "step_00000000.h5: a llama model with 0 experts and q/k norms: no export format holds it" \
  "$WORK/dense/checkpoints"
"$TESSERA" train "$deck" train.steps=0 model.moe.score=sigmoid run.dir="$WORK/sigmoid" >sigmoid.log 2>&1
export_error "sigmoid scores" "step_00000000.h5: the deck's model.moe.score is 'sigmoid': Qwen3MoeForCausalLM routes with score 'softmax'" \
  "$WORK/sigmoid/checkpoints"
if [ -z "$(ls -A exp_bad)" ]; then pass "export errors wrote nothing"; else fail "export errors wrote $(ls exp_bad)"; fi
finish
