#!/usr/bin/env bash
# Hugging Face LLaMA interop without the internet (the hf-llama layout): a random
# LlamaForCausalLM state dict (grouped-query attention, untied head; and a tied one) imported,
# tessera's eval loss against an independent PyTorch forward by the HF names, with q_proj and
# k_proj taken as they are (no row permutation); the same model in Meta's original layout
# (meta-llama: q and k rows permuted by the import) gives the same checkpoint; export -> import
# round trips to the bit; transformers loads the export (where it is installed); init_from on
# tp=2; every bad input one line, exit 2, nothing written.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/hf_import.sh"
HF="$PYTHON $ROOT/tests/integration/hf_llama.py"
test_data
cd "$WORK" || exit 1
# 2 layers, 4 heads on 2 key/value heads, n_embd 32, ffn 96, 64 positions, vocab 257, untied;
# rms_norm_eps 1e-6 and rope_theta 500 (not the defaults, so both must be carried).
# hf/ (untied), hf/meta/ (Meta's layout), hf/tied/, hf/bad/DEFECT/: one python (torch starts once).
$HF make --out hf >/dev/null || { fail "make the random HF LLaMAs"; finish; }

deck=$WORK/llama.yaml
hf_deck "$deck" 3.0e-3 <<'MODEL'
model:
  arch: llama
  n_layer: 2
  n_head: 4
  n_kv_head: 2
  n_embd: 32
  ffn_hidden: 96
  block_size: 64
  norm_eps: 1.0e-6
  rope_theta: 500.0
MODEL

# 1. Import the torch state dict against the deck: the model section on stdout.
import_against_deck 'hf-llama, 2 layers, 4 heads (2 key/value)' '  arch: llama' '  n_kv_head: 2' \
  '  ffn_hidden: 96' '  tie_embeddings: false' '  norm_eps: 1.0e-06' '  rope_theta: 500.0'

# 2. tessera eval equals the HF LLaMA forward (float64, written from the HF names) to 1e-5, with
# q_proj and k_proj as Hugging Face stores them; the same weights with the row permutation the
# issue assumed (Meta's -> HF's, applied once more) give another loss, so a permutation in the
# import would have been caught.
got=$(eval_loss imp.h5)
# One python for the three HF losses: untied, tied (section 5) and untied with q/k permuted.
read -r want want_t permuted <<<"$($HF loss --weights hf/pytorch_model.bin --config hf/config.json \
  --weights hf/tied/model.safetensors --config hf/tied/config.json --data "$DATA/val.h5" \
  --seq-len 16 --windows 16 --permute-qk | tr '\n' ' ')"
if close "$got" "$want" 1e-5; then
  pass "tessera eval $got equals the HF LLaMA forward $want (16 windows of 17 tokens, GQA, untied)"
else
  fail "tessera eval '$got' vs HF forward '$want'"
fi
if ! close "$got" "$permuted" 1e-3; then
  pass "q/k rows permuted as Meta -> HF would give $permuted: no permutation is right"
else
  fail "the q/k permutation does not change the loss ($permuted): the test cannot tell"
fi

# 3. A model directory (model.safetensors + config.json) and the bare safetensors with --deck
# (no config.json: the deck gives the heads, eps, theta and block) give the same tensors.
same_imports "directory, safetensors without config.json (--deck) and torch.load imports equal to the bit, shape attributes too" <<'PY'
import sys, h5py
a, b = (h5py.File(p, "r")["model"].attrs for p in sys.argv[1:3])
assert all(a[k] == b[k] for k in a), {k: (a[k], b[k]) for k in a if a[k] != b[k]}
assert not h5py.File(sys.argv[1], "r")["model/lm_head.weight"][257:].any()
PY

# 3b. Meta's original layout (consolidated.00.pth, params.json; wq and wk rows in Meta's
# interleaved pairs, made from the HF model by the inverse of Hugging Face's permute): the import
# permutes them back, giving the HF import's checkpoint to the bit.
if $IMPORT hf/meta --out meta.h5 >meta.yaml 2>meta.log &&
   grep -q "meta-llama, 2 layers, 4 heads (2 key/value)" meta.log &&
   $HF compare imp.h5 meta.h5 >/dev/null && cmp -s model.yaml meta.yaml &&
   "$PYTHON" - imp.h5 meta.h5 <<'PY'
import sys, h5py
a, b = (h5py.File(p, "r")["model"].attrs for p in sys.argv[1:3])
assert all(a[k] == b[k] for k in a), {k: (a[k], b[k]) for k in a if a[k] != b[k]}
PY
then
  pass "meta-llama import (q/k rows permuted back) equals the HF import to the bit: $(cat meta.log)"
else
  fail "meta-llama import: $($HF compare imp.h5 meta.h5)"; cat meta.log
fi

# 4. HF -> tessera -> HF gives the original tensors back to the bit; config.json is LlamaConfig's;
# tessera -> HF -> tessera the checkpoint.
if exported imp.h5 <<'PY'
import json, sys
c = json.load(open(sys.argv[2] + "/config.json"))
want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32,
        "intermediate_size": 96, "max_position_embeddings": 64, "vocab_size": 257,
        "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 500.0, "rope_scaling": None,
        "attention_bias": False, "tie_word_embeddings": False, "head_dim": 8}
assert all(c[k] == v for k, v in want.items()), {k: c.get(k) for k in want}
import safetensors_io
with safetensors_io.File(sys.argv[2] + "/model.safetensors") as f:
    assert f.metadata == {"format": "pt"}, f.metadata
    names = set(f.tensors)
    assert f.tensors["model.layers.1.self_attn.k_proj.weight"].shape == (16, 32)
assert "lm_head.weight" in names and all(n.startswith("model.") for n in names - {"lm_head.weight"})
PY
then
  pass "export: model.safetensors and pytorch_model.bin equal the HF originals to the bit; LlamaConfig, model. prefix, untied lm_head"
else
  fail "export"; cat export.log
fi
# transformers' own LlamaForCausalLM on the export, where /usr/bin/python3 has transformers.
transformers_loads LlamaForCausalLM
reimported

# 5. Tied embeddings (tie_word_embeddings true: no lm_head in the safetensors, a shared one in the
# torch file): imported without lm_head, the same loss as the HF forward, exported tied.
sed 's/ffn_hidden: 96/ffn_hidden: 96\n  tie_embeddings: true/' "$deck" >deck_tied.yaml
$IMPORT hf/tied --out tied.h5 --deck deck_tied.yaml >/dev/null 2>tied.log
$IMPORT hf/tied/pytorch_model.bin --out tied_bin.h5 >/dev/null 2>&1
got_t=$(eval_loss tied.h5)
if close "$got_t" "$want_t" 1e-5 && $HF compare tied.h5 tied_bin.h5 >/dev/null &&
   $EXPORT tied.h5 --out exp_tied --torch-bin >/dev/null 2>&1 &&
   $HF compare hf/tied/model.safetensors exp_tied/model.safetensors >/dev/null &&
   "$PYTHON" - tied.h5 exp_tied <<'PY'
import json, sys, h5py, torch
with h5py.File(sys.argv[1], "r") as f:
    assert "lm_head.weight" not in f["model"] and int(f["model"].attrs["tie_embeddings"]) == 1
assert json.load(open(sys.argv[2] + "/config.json"))["tie_word_embeddings"] is True
sd = torch.load(sys.argv[2] + "/pytorch_model.bin")
assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
PY
then
  pass "tied LLaMA: eval $got_t equals the HF forward $want_t; no lm_head in tessera; export ties it"
else
  fail "tied LLaMA (eval '$got_t' vs '$want_t')"; cat tied.log
fi

# 6. A trained tessera LLaMA -> HF -> tessera: every tensor to the bit (the real rows of the
# embedding and the head) and the same eval loss; checkpoint.init_from starts from the import.
"$TESSERA" train "$deck" run.dir="$WORK/trained" >trained.log 2>&1 || fail "train"
if trained_round_trip "$WORK/trained/checkpoints" embed_tokens.weight:257 lm_head.weight:257; then
  pass "trained LLaMA checkpoint -> export -> import: tensors to the bit, same eval loss"
else
  fail "trained round trip: $(cat trained.cmp)"
fi
"$TESSERA" train "$deck" checkpoint.init_from=imp.h5 train.steps=3 >init.log 2>&1
v0=$(first_val_loss ft/metrics.jsonl)
if grep -q "^init: weights from imp.h5 (step 0" init.log && grep -q "^step      3/3" init.log &&
   close "${v0:-nan}" "$got" 1e-5; then
  pass "init_from: step 0 val_loss $v0 = the imported model's eval loss; 3 steps trained"
else
  fail "init_from run (val_loss '$v0', eval '$got')"; tail -3 init.log
fi
# tp=2 splits the 2 key/value heads one per rank: the 1-rank run's losses and tensors.
fine_tune ft_tp2 2 train.steps=3 parallel.tp=2
if runs_agree ft ft_tp2 3 >cmp.txt 2>&1; then
  pass "init_from on tp=2 = the 1-rank run: $(cat cmp.txt)"
else
  fail "init_from tp=2: $(tail -2 cmp.txt)"; tail -3 ft_tp2.log
fi

# 7. Import errors: one line naming the tensor, the key and the values, exit 2, nothing written.
import_error "missing tensor" "hf/bad/missing: missing tensor model.layers.1.mlp.up_proj.weight \[96, 32\] \(hf-llama, n_layer 2\)" hf/bad/missing
import_error "extra tensor (a bias)" "hf/bad/extra: unexpected tensor layers.0.self_attn.q_proj.bias \[32\]: not part of the hf-llama layout" hf/bad/extra
import_error "wrong shape" "hf/bad/shape: model.layers.1.self_attn.k_proj.weight is \[32, 32\], .* needs \[16, 32\]" hf/bad/shape
import_error "rope_scaling" "hf/bad/rope_scaling: config.json rope_scaling = .*linear.*: tessera's rotary embedding has no scaling" hf/bad/rope_scaling
import_error "hidden_act gelu" "hf/bad/gelu: config.json hidden_act = 'gelu': tessera's LLaMA MLP is SwiGLU" hf/bad/gelu
import_error "tied in config.json, untied in the file" "lm_head.weight differs from model.embed_tokens.weight: the head is not tied, but the model ties it \(config.json\)" hf/bad/tied_differs
import_error "key/value heads not dividing the heads" "hf/bad/kv_heads: num_key_value_heads 3 does not divide num_attention_heads 4" hf/bad/kv_heads
mkdir -p meta_scaled && cp hf/meta/consolidated.00.pth meta_scaled/
"$PYTHON" -c 'import json, sys; p = json.load(open(sys.argv[1])); p["use_scaled_rope"] = True
json.dump(p, open(sys.argv[2], "w"))' hf/meta/params.json meta_scaled/params.json
import_error "meta-llama with use_scaled_rope" "meta_scaled/consolidated.00.pth: params.json use_scaled_rope = true: tessera's rotary embedding has no scaling" meta_scaled/consolidated.00.pth
cp meta_scaled/consolidated.00.pth meta_scaled/consolidated.01.pth
import_error "Meta's tensor-parallel split" "meta_scaled: Meta's checkpoint in several consolidated.\*.pth files" meta_scaled
import_error "unknown --layout" "unknown layout 'hf-llama3' \(known: hf-gpt2, hf-llama, meta-llama, hf-mixtral, hf-qwen3-moe\)" hf --layout hf-llama3
import_error "HF weights read as meta-llama" "hf: no layers.0.attention.wq.weight: not a meta-llama state dict" hf --layout meta-llama
import_error "no config.json, no deck" "bare/model.safetensors: hf-llama weights without a config.json: give it .* or --deck" bare/model.safetensors
sed 's/n_kv_head: 2/n_kv_head: 4/' "$deck" >deck_kv4.yaml
import_error "deck n_kv_head" "deck_kv4.yaml: model.n_kv_head = 4, but hf has n_kv_head 2 \(config.json\)" hf --deck deck_kv4.yaml
sed 's/ffn_hidden: 96/ffn_hidden: 0\n  ffn_multiple: 64/' "$deck" >deck_ffn.yaml
import_error "deck ffn_hidden (the default: 8C/3 rounded up to 64)" "deck_ffn.yaml: model.ffn_hidden = 128, but hf has ffn_hidden 96 \(model.layers.0.mlp.gate_proj.weight \[96, 32\]\)" hf --deck deck_ffn.yaml
sed 's/rope_theta: 500.0/rope_theta: 10000.0/' "$deck" >deck_theta.yaml
import_error "deck rope_theta" "deck_theta.yaml: model.rope_theta = 10000.0, but hf has rope_theta 500.0 \(config.json\)" hf --deck deck_theta.yaml
sed 's/norm_eps: 1.0e-6/norm_eps: 1.0e-5/' "$deck" >deck_eps.yaml
import_error "deck norm_eps" "deck_eps.yaml: model.norm_eps = 1.0e-05, but hf has norm_eps 1.0e-06 \(config.json\)" hf --deck deck_eps.yaml
sed 's/arch: llama/arch: gpt2/' "$deck" >deck_gpt2.yaml
import_error "deck arch" "deck_gpt2.yaml: model.arch = gpt2, but hf holds a llama model \(hf-llama\)" hf --deck deck_gpt2.yaml
sed 's/block_size: 64/block_size: 64\n  vocab_size: 300/' "$deck" >deck_vocab.yaml
import_error "deck vocab" "deck_vocab.yaml: model.vocab_size is 300, but hf has vocab_size 257 \(model.embed_tokens.weight \[257, 32\]\)" hf --deck deck_vocab.yaml
sed 's/n_embd: 32/n_embd: 64/' "$deck" >deck_embd.yaml
import_error "deck n_embd (no config.json)" "deck_embd.yaml: model.n_embd = 64, but bare/model.safetensors has n_embd 32 \(model.embed_tokens.weight \[257, 32\]\)" bare/model.safetensors --deck deck_embd.yaml

# 8. Export errors: a format that cannot hold the model; nothing written.
mkdir -p exp_bad
export_error "a llama checkpoint as hf-gpt2" "imp.h5: a llama model; the hf-gpt2 format holds gpt2 models \(GPT2LMHeadModel\)" \
  imp.h5 --format hf-gpt2
"$TESSERA" train "$(tiny_deck untied)" model.tie_embeddings=false train.steps=0 >untied.log 2>&1
export_error "an untied GPT-2" "step_00000000.h5: the model's tensor lm_head.weight has no place in the hf-gpt2 layout \(GPT2LMHeadModel\)" \
  "$WORK/untied/checkpoints"
export_error "--format meta-llama" "--format meta-llama: an import layout only \(export formats: hf-gpt2, hf-llama, hf-mixtral, hf-qwen3-moe\)" \
  imp.h5 --format meta-llama
if [ -z "$(ls -A exp_bad)" ]; then pass "export errors wrote nothing"; else fail "export errors wrote $(ls exp_bad)"; fi
finish
