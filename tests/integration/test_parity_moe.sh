#!/usr/bin/env bash
# tessera's mixture-of-experts layers (model.moe) against the independent PyTorch reference
# (tools/reference/reference_moe.py, used by reference_gpt.py and reference_llama.py). First the
# reference against itself, without tessera: one expert is the dense MLP, and torch's gradients
# of a layer that drops pairs at its capacity agree with finite differences. Then, as
# test_parity.sh: both start from the same step-0 checkpoint and train 10 steps on the same
# batches; every step's loss (the cross-entropy, without the balancing losses) agrees to a
# relative 1e-5 and every final tensor to 1e-4 of its largest magnitude, for GPT-2 with every
# layer MoE (softmax router, aux and z losses), LLaMA with MoE on every second layer (sigmoid
# router), GPT-2 with a capacity that drops pairs, LLaMA with DeepSeek-V3's auxiliary-loss-free
# selection bias, and GPT-2 and LLaMA with DeepSeek's shared experts.
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1

# --- The reference alone, in float64. --------------------------------------------------------
if "$PYTHON" - >selfcheck.log 2>&1 <<'PY'
import sys
import torch
import torch.nn.utils.stateless
import reference_gpt as rg
import reference_llama as rl
from reference_moe import MoeMlp, moe_config
from reference_train import make_optimizer, train_step

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
bad = []
def check(ok, what):
    print(("ok   " if ok else "BAD  ") + what)
    if not ok:
        bad.append(what)

def cfg(**kw):
    base = dict(experts=1, top_k=1, score="softmax", renormalize=True, aux_loss=0.0, z_loss=0.0)
    return moe_config(dict(base, **kw), "check")

def normal_(module):
    for p in module.parameters():
        torch.nn.init.normal_(p)

# One expert, top-1, renormalised (its gate is exactly 1): the dense MLP with the same weights,
# with the experts' tensors 3-D and stacked by rows.
C, Fh = 8, 32
x = torch.randn(3, 5, C)
for stacked in (False, True):
    dense, moe = rg.MLP(C), MoeMlp(C, dict(cfg(), ffn=4 * C, stacked=stacked), "gelu")
    normal_(dense), normal_(moe)
    with torch.no_grad():
        for name in ("c_fc", "c_proj"):
            for kind in ("weight", "bias"):
                t = getattr(getattr(moe.experts, name), kind)
                t.copy_(getattr(getattr(dense, name), kind).reshape(t.shape))
    d = (moe(x) - dense(x)).abs().max().item()
    check(d <= 1e-12, f"GPT-2, E=1 k=1, stacked={stacked}: the dense MLP, max |diff| {d:.1e}")
    dense, moe = rl.LlamaMLP(C, Fh), MoeMlp(C, dict(cfg(), ffn=Fh, stacked=stacked), "swiglu")
    normal_(dense), normal_(moe)
    with torch.no_grad():
        gu, down = moe.experts.gate_up_proj.weight, moe.experts.down_proj.weight
        gu.copy_(torch.cat([dense.gate_proj.weight, dense.up_proj.weight]).reshape(gu.shape))
        down.copy_(dense.down_proj.weight.reshape(down.shape))
    d = (moe(x) - dense(x)).abs().max().item()
    check(d <= 1e-12, f"LLaMA, E=1 k=1, stacked={stacked}: the dense MLP, max |diff| {d:.1e}")

# The same through a whole GPT-2 whose layers are all MoE: objective and gradients.
V, T = 50, 6
dense = rg.GPT(2, 2, C, T, 64, V)
moe = rg.GPT(2, 2, C, T, 64, V, {0: dict(cfg(), ffn=4 * C), 1: dict(cfg(), ffn=4 * C)})
for p in dense.parameters():
    torch.nn.init.normal_(p, std=0.3)
sd = dense.state_dict()
def dense_name(n):
    return n.replace("mlp.experts.", "mlp.")
moe.load_state_dict({n: sd[dense_name(n)].reshape(t.shape) if dense_name(n) in sd else torch.randn(t.shape)
                     for n, t in moe.state_dict().items()})
idx, tgt = torch.randint(0, V, (2, T)), torch.randint(0, V, (2, T))
ld, lm = dense(idx, tgt), moe(idx, tgt)
ld.backward(), lm.backward()
gd = dict(dense.named_parameters())
worst = max((p.grad - gd[dense_name(n)].grad.reshape(p.shape)).abs().max().item()
            for n, p in moe.named_parameters() if "router" not in n)
d = abs(ld.item() - lm.item())
check(d <= 1e-12 and worst <= 1e-12,
      f"GPT-2, every layer MoE with E=1: objective diff {d:.1e}, worst gradient diff {worst:.1e}")

# The choice and the capacity by hand: a zero router ties all experts, so every token takes
# experts 0 then 1 (the lower index first), gates 1/2; capacity_factor 1 with N=6, k=2, E=4 is
# 3 pairs an expert: tokens 3..5 are dropped from both.
m = MoeMlp(4, dict(cfg(experts=4, top_k=2, capacity_factor=1.0), ffn=5), "gelu")
normal_(m)
torch.nn.init.zeros_(m.router.weight)
xs = torch.randn(6, 4)
y = m(xs)
want = 0.5 * m.expert(0, xs[:3]) + 0.5 * m.expert(1, xs[:3])
check(m.routed.tolist() == [6, 6, 0, 0] and m.dropped == 6 and
      (y[:3] - want).abs().max().item() <= 1e-14 and not y[3:].any(),
      f"ties go to the lower index, each expert keeps its first tokens: routed {m.routed.tolist()}, "
      f"dropped {m.dropped}")

# gradcheck: N=6, C=4, E=4, k=2, capacity_factor 0.5 (2 of an expert's pairs kept), aux and z
# losses on; both families, both scores, renormalised or not. Outputs: the layer's and its loss.
for kind in ("gelu", "swiglu"):
    for score in ("softmax", "sigmoid"):
        for renorm in (True, False):
            torch.manual_seed(1)
            m = MoeMlp(4, dict(cfg(experts=4, top_k=2, score=score, renormalize=renorm,
                                   aux_loss=0.3, z_loss=0.2, capacity_factor=0.5), ffn=3), kind)
            normal_(m)
            names = [n for n, _ in m.named_parameters()]
            xs = torch.randn(6, 4, requires_grad=True)
            def f(xs, *params):
                out = torch.nn.utils.stateless.functional_call(m, dict(zip(names, params)), (xs,))
                return out, m.loss
            params = tuple(p.detach().clone().requires_grad_(True) for p in m.parameters())
            m(xs.detach())
            dropped, routed, loss = m.dropped, m.routed.tolist(), m.loss.item()
            ok = torch.autograd.gradcheck(f, (xs,) + params, eps=1e-6, atol=1e-8, rtol=1e-6,
                                          raise_exception=False)
            check(ok and dropped > 0, f"gradcheck {kind} {score} renormalize={renorm}: routed "
                  f"{routed}, {dropped} of 12 pairs dropped, aux + z {loss:.4f}")

# A step reports the cross-entropy; it trains on the objective, which adds the balancing losses.
c = dict(cfg(experts=4, top_k=2, aux_loss=0.5, z_loss=0.5), ffn=16)
model = rg.GPT(2, 2, C, T, 64, V, {1: c})
rg.init_random(model, 0.2, 3)
opt = make_optimizer(model, {"lr": 1e-3, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8})
decayed = {id(p) for p in opt.param_groups[0]["params"]}
names = [n for n, p in model.named_parameters() if id(p) in decayed]
check(not any(n.endswith("bias") for n in names) and "h.1.mlp.experts.c_fc.weight" in names and
      "h.1.mlp.router.weight" in names, "weight decay on the router and expert weights, on no bias")
batches = [tuple(torch.randint(0, V, (2, T)).numpy() for _ in range(2)) for _ in range(2)]
ce = obj = 0.0
with torch.no_grad():
    for a, b in batches:
        obj += model(torch.from_numpy(a), torch.from_numpy(b)).item() / 2
        ce += model.last_ce.item() / 2
loss, _ = train_step(model, opt, batches, 1e-3, 1.0)
check(abs(loss - ce) <= 1e-12 and obj - ce > 1e-3,
      f"reported loss {loss:.6f} = the cross-entropy {ce:.6f}; objective {obj:.6f}")
sys.exit(1 if bad else 0)
PY
then
  pass "the reference alone (float64):"; sed 's/^/    /' selfcheck.log
else
  fail "the reference alone:"; sed 's/^/    /' selfcheck.log | tail -30
fi

# --- tessera against the reference. ----------------------------------------------------------
# worst NAME: the worst loss and tensor of compare_parity's table NAME.compare.
worst() {
  "$PYTHON" - "$1.compare" <<'PY'
import re, sys
loss = tensor = (0.0, "")
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4 and re.fullmatch(r"\d+", f[0]):
        loss = max(loss, (float(f[3]), "step " + f[0]))
    elif len(f) == 3 and f[0] != "tensor":
        tensor = max(tensor, (float(f[1]) / float(f[2]), f[0]))
print(f"worst loss: relative {loss[0]:.2e} ({loss[1]}); worst tensor: {tensor[0] * 1e-4:.2e} "
      f"of its max ({tensor[1]})")
PY
}

# moe_parity NAME REFERENCE SETTINGS...: tessera's step-0 checkpoint (run dir NAME_init), 10
# steps of tessera (run dir NAME) and of tools/reference/REFERENCE from it, compared; returns 1
# when there is no step-0 checkpoint (the checks that read it are then skipped).
moe_parity() {
  local name=$1 ref=$2 deck
  shift 2
  deck=$(tiny_deck "$name")
  if "$TESSERA" train "$deck" "$@" train.steps=0 run.dir="$WORK/${name}_init" >"$name.init.log" 2>&1 &&
     [ -f "$WORK/${name}_init/checkpoints/step_00000000.h5" ]; then
    pass "$name: step-0 checkpoint written"
  else
    fail "$name: step-0 checkpoint"; tail -5 "$name.init.log"; return 1
  fi
  if "$TESSERA" train "$deck" "$@" train.steps=10 >"$name.log" 2>&1; then
    pass "$name: tessera trained 10 steps"
  else
    fail "$name: tessera train"; tail -5 "$name.log"
  fi
  if "$PYTHON" "$ROOT/tools/reference/$ref" --checkpoint "$WORK/${name}_init/checkpoints/step_00000000.h5" \
       --steps 10 --threads 2 --out "$name.ref.h5" --losses-out "$name.ref.json" >"$name.ref.log" 2>&1; then
    pass "$name: the reference trained 10 steps"
  else
    fail "$name: reference"; tail -5 "$name.ref.log"
  fi
  if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/$name/metrics.jsonl" \
       --losses "$name.ref.json" --checkpoint "$WORK/$name/checkpoints/step_00000010.h5" \
       --reference "$name.ref.h5" --loss-rtol 1e-5 --param-tol 1e-4 >"$name.compare" 2>&1; then
    pass "$name: every loss within 1e-5 and every tensor within 1e-4 of its max: $(worst "$name")"
  else
    fail "$name: parity"; sed 's/^/    /' "$name.compare" | head -60
  fi
}

# has_tensors CKPT NAME...: every /model/NAME is in CKPT ("!NAME": is not); prints the shapes.
has_tensors() {
  "$PYTHON" - "$@" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    m = f["model"]
    for name in sys.argv[2:]:
        if (name[1:] in m) if name.startswith("!") else (name not in m):
            sys.exit(f"/model/{name.lstrip('!')}: {'present' if name.startswith('!') else 'absent'}")
    print(", ".join(f"{n} {list(m[n].shape)}" for n in sys.argv[2:] if not n.startswith("!")))
PY
}

# without NAME REFERENCE WHAT MOE-KEYS: the reference, from NAME's step-0 checkpoint with its deck's
# model.moe updated by MOE-KEYS (a JSON object), must no longer agree with NAME's
# tessera run: WHAT reaches the reference from the deck and is tested.
without() {
  local name=$1 ref=$2 what=$3 keys=$4
  cp "$WORK/${name}_init/checkpoints/step_00000000.h5" "$name.without.h5"
  "$PYTHON" -c 'import h5py, json, sys, yaml
f = h5py.File(sys.argv[1], "r+")
deck = yaml.safe_load(f.attrs["deck"])
deck["model"]["moe"].update(json.loads(sys.argv[2]))
f.attrs["deck"] = yaml.safe_dump(deck)' "$name.without.h5" "$keys"
  "$PYTHON" "$ROOT/tools/reference/$ref" --checkpoint "$name.without.h5" --steps 10 --threads 2 \
    --out "$name.without.ref.h5" --losses-out "$name.without.ref.json" >"$name.without.log" 2>&1
  if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/$name/metrics.jsonl" \
       --losses "$name.without.ref.json" --checkpoint "$WORK/$name/checkpoints/step_00000010.h5" \
       --reference "$name.without.ref.h5" --loss-rtol 1e-5 --param-tol 1e-4 >/dev/null 2>&1; then
    fail "$name: a reference without $what still agrees: $what untested"
  else
    pass "$name: a reference without $what disagrees"
  fi
}

# As test_parity.sh (its optim.eps = 1e-6: c_attn's key bias has a zero gradient), 2
# micro-batches of 4 x 32 tokens: N = 128 tokens a routing.
gpt=(model.n_embd=32 model.block_size=32 data.seq_len=32 train.batch_size=8 train.micro_batch=4
     optim.decay_steps=10 optim.warmup_steps=3 optim.grad_clip=1.0 optim.lr=1e-2 optim.min_lr=1e-3
     optim.eps=1e-6 model.moe.experts=4 model.moe.top_k=2 model.moe.aux_loss=0.01
     model.moe.z_loss=0.001)

# (a) GPT-2, both layers MoE: softmax scores, renormalised, dropless, aux and z losses.
ck=$WORK/gpt_moe_init/checkpoints/step_00000000.h5
if moe_parity gpt_moe reference_gpt.py "${gpt[@]}"; then
  if out=$(has_tensors "$ck" h.0.mlp.router.weight h.1.mlp.experts.c_fc.weight h.1.mlp.experts.c_fc.bias \
             h.1.mlp.experts.c_proj.weight h.1.mlp.experts.c_proj.bias '!h.0.mlp.c_fc.weight' 2>&1); then
    pass "gpt_moe: the step-0 model's MoE tensors: $out"
  else
    fail "gpt_moe: the step-0 model: $(tail -1 <<<"$out")"
  fi
  # The balancing losses reach the reference from the deck: without them it no longer agrees.
  without gpt_moe reference_gpt.py "the aux and z losses" '{"aux_loss": 0.0, "z_loss": 0.0}'
fi

# (b) LLaMA, layer 0 dense and layer 1 MoE (every = 2), sigmoid scores; grouped-query attention
# and optim.eps = 1e-5 as test_parity_llama.sh (its reasons).
llama=(model.arch=llama model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=32
       model.ffn_multiple=32 model.block_size=32 data.seq_len=32 train.batch_size=8
       train.micro_batch=4 optim.decay_steps=10 optim.warmup_steps=3 optim.grad_clip=1.0
       optim.lr=1e-2 optim.min_lr=1e-3 optim.weight_decay=0.1 optim.eps=1e-5
       model.moe.experts=4 model.moe.top_k=2 model.moe.every=2 model.moe.score=sigmoid
       model.moe.aux_loss=0.01 model.moe.z_loss=0.001)
if moe_parity llama_moe reference_llama.py "${llama[@]}"; then
  if out=$(has_tensors "$WORK/llama_moe_init/checkpoints/step_00000000.h5" layers.0.mlp.gate_proj.weight \
             layers.1.mlp.router.weight layers.1.mlp.experts.gate_up_proj.weight \
             layers.1.mlp.experts.down_proj.weight '!layers.0.mlp.router.weight' \
             '!layers.1.mlp.gate_proj.weight' 2>&1); then
    pass "llama_moe: layer 0 dense, layer 1 MoE: $out"
  else
    fail "llama_moe: the step-0 model: $(tail -1 <<<"$out")"
  fi
fi

# (c) GPT-2 with capacity_factor 1: an expert keeps ceil(128 x 2 / 4) = 64 pairs a micro-batch.
# The capacity is exercised: the reference drops pairs on step 1's micro-batches already.
if moe_parity gpt_capacity reference_gpt.py "${gpt[@]}" model.moe.capacity_factor=1.0 &&
   out=$("$PYTHON" - "$WORK/gpt_capacity_init/checkpoints/step_00000000.h5" <<'PY' 2>&1
import sys, torch
import reference_gpt as rg
from reference_moe import MoeMlp
from reference_train import load_checkpoint, load_weights
from tessera_data import read_token_file, train_step_batches
path = sys.argv[1]
ck = load_checkpoint(path)
model = rg.build_model(ck, path)
load_weights(model, ck["model"], path)
tokens, _ = read_token_file(ck["deck"]["data"]["train"])
tr = ck["deck"]["train"]
dropped = 0
with torch.no_grad():
    for x, y in train_step_batches(tokens, ck["deck"]["data"]["seq_len"], 0, tr["batch_size"],
                                   tr["micro_batch"], ck["seed"], ck["next_sample"]):
        model(torch.from_numpy(x), torch.from_numpy(y))
        dropped += sum(m.dropped for m in model.modules() if isinstance(m, MoeMlp))
print(dropped)
sys.exit(dropped == 0)
PY
); then
  pass "gpt_capacity: $out of step 1's 1024 (token, choice) pairs dropped"
elif [ -n "${out:-}" ]; then
  fail "gpt_capacity: no pair dropped, the capacity is untested: $(tail -1 <<<"$out")"
fi

# (d) DeepSeek-V3's auxiliary-loss-free balancing: LLaMA with both layers MoE, sigmoid scores,
# no auxiliary loss, each expert's selection bias moved 0.02 a step toward the mean load. The
# bias changes the choices: a reference without it disagrees; the checkpoint keeps it.
bias=("${llama[@]}" model.moe.every=1 model.moe.aux_loss=0 model.moe.bias_rate=0.02)
if moe_parity llama_bias reference_llama.py "${bias[@]}"; then
  ck=$WORK/llama_bias/checkpoints/step_00000010.h5
  if out=$("$PYTHON" - "$ck" <<'PY' 2>&1
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    b = f["train/moe_bias"][...]
steps = b / 0.02
assert b.shape == (2, 4), b.shape
assert np.abs(steps - np.round(steps)).max() < 1e-4 and np.abs(b).max() > 0, b
print(f"/train/moe_bias {list(b.shape)}, from {b.min():.2f} to {b.max():.2f}")
PY
  ); then
    pass "llama_bias: the step-10 checkpoint keeps the biases: $out"
  else
    fail "llama_bias: /train/moe_bias: $(tail -1 <<<"$out")"
  fi
  without llama_bias reference_llama.py "the bias" '{"bias_rate": 0.0}'
fi

# (e) DeepSeek's shared experts (model.moe.shared_experts): an always-on MLP of width S x ffn
# beside the routed experts, y = routed(x) + shared(x). GPT-2 with one (every layer MoE, biases)
# and LLaMA with two (layer 1 MoE); their tensors under mlp.shared_experts.
if moe_parity gpt_shared reference_gpt.py "${gpt[@]}" model.moe.ffn=48 model.moe.shared_experts=1; then
  if out=$(has_tensors "$WORK/gpt_shared_init/checkpoints/step_00000000.h5" \
             h.0.mlp.shared_experts.c_fc.weight h.0.mlp.shared_experts.c_fc.bias \
             h.1.mlp.shared_experts.c_proj.weight h.1.mlp.shared_experts.c_proj.bias \
             h.1.mlp.experts.c_fc.weight '!h.0.mlp.c_fc.weight' 2>&1); then
    pass "gpt_shared: the step-0 model's shared experts: $out"
  else
    fail "gpt_shared: the step-0 model: $(tail -1 <<<"$out")"
  fi
fi
if moe_parity llama_shared reference_llama.py "${llama[@]}" model.moe.shared_experts=2; then
  if out=$(has_tensors "$WORK/llama_shared_init/checkpoints/step_00000000.h5" \
             layers.1.mlp.shared_experts.gate_proj.weight layers.1.mlp.shared_experts.up_proj.weight \
             layers.1.mlp.shared_experts.down_proj.weight layers.0.mlp.gate_proj.weight \
             '!layers.0.mlp.shared_experts.gate_proj.weight' 2>&1); then
    pass "llama_shared: layer 1's shared experts, of width 2 x ffn: $out"
  else
    fail "llama_shared: the step-0 model: $(tail -1 <<<"$out")"
  fi
fi
finish
