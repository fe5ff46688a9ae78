#!/usr/bin/env bash
# Self-checks of the Python tools, without the tessera binary: token files, sample order, the
# reference model and optimizer (against hand computations), resume from a checkpoint with Adam
# state, the parity comparison, bench mode (the parity reference's and make bench-gpu's PyTorch
# half on tiny shapes) and the tools' error messages.
# Usage: PYTHON=/usr/bin/python3 bash tests/integration/test_tools.sh
set -u
PYTHON=${PYTHON:-/usr/bin/python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOOLS=$ROOT/tools
WORK=$(mktemp -d "${TMPDIR:-/tmp}/test_tools.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
export PYTHONPATH=$TOOLS/data:$TOOLS/interop:$TOOLS/reference
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

FAILS=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; FAILS=$((FAILS + 1)); }
# check NAME CMD...: runs CMD, PASS when it exits 0; its output goes to NAME.log.
check() {
  local name=$1; shift
  if "$@" >"$WORK/$name.log" 2>&1; then pass "$name"; else fail "$name"; sed 's/^/    /' "$WORK/$name.log"; fi
}
# expect_error NAME CODE CMD...: CMD must exit CODE with a one-line message and no traceback.
expect_error() {
  local name=$1 code=$2; shift 2
  "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  if [ "$rc" -eq "$code" ] && ! grep -q Traceback "$WORK/$name.err" && [ "$(wc -l <"$WORK/$name.err")" -ge 1 ]; then
    pass "$name (exit $rc: $(head -n1 "$WORK/$name.err"))"
  else
    fail "$name (exit $rc, expected $code)"; sed 's/^/    /' "$WORK/$name.err"
  fi
}

# --- sample order ----------------------------------------------------------------------------
check data_selftest "$PYTHON" "$TOOLS/data/tessera_data.py" selftest

# --- prepare_data ----------------------------------------------------------------------------
mkdir -p corpus/sub corpus/skip
printf 'alpha\n' >corpus/a.py
printf 'bravo bravo\n' >corpus/b.txt
printf '' >corpus/c.md
printf 'delta \xc3\xa9\xff\n' >corpus/sub/d.rst
printf 'echo\n' >corpus/sub/e.py
printf 'not taken: wrong suffix\n' >corpus/skip/f.bin
printf 'foxtrot\n' >g.dat
check prepare_data "$PYTHON" "$TOOLS/data/prepare_data.py" corpus "$WORK/g.*" --out-dir out --val-every 3
check prepare_deterministic "$PYTHON" "$TOOLS/data/prepare_data.py" "$WORK/g.dat" corpus --out-dir out2 --val-every 3
check prepare_same_bytes cmp out/train.h5 out2/train.h5

check token_files "$PYTHON" - <<'EOF'
import os, h5py, numpy as np
import tessera_data as td
docs = sorted(os.path.abspath(p) for p in
              ["corpus/a.py", "corpus/b.txt", "corpus/c.md", "corpus/sub/d.rst", "corpus/sub/e.py", "g.dat"])
want = {"train.h5": [], "val.h5": []}
for i, p in enumerate(docs):
    want["val.h5" if i % 3 == 2 else "train.h5"].append(p)
assert not os.path.exists("out/train.h5.tmp") and not os.path.exists("out/val.h5.tmp")
for name, paths in want.items():
    expect = []
    for p in paths:
        expect += list(open(p, "rb").read()) + [256]
    with h5py.File("out/" + name) as f:
        ds = f["tokens"]
        assert ds.dtype == np.uint16 and ds.ndim == 1, ds.dtype
        assert ds.chunks is None and ds.compression is None, "not contiguous"
        assert ds.id.get_offset() is not None and ds.id.get_offset() % 4096 == 0, ds.id.get_offset()
        assert ds[...].tolist() == expect, (name, ds[...].tolist(), expect)
        a = f.attrs
        assert a["format"] == b"tessera-tokens" and isinstance(a["format"], np.bytes_), a["format"]
        assert a["tokenizer"] == b"byte"
        for k, v in [("format_version", 1), ("vocab_size", 257), ("eot", 256), ("num_documents", len(paths))]:
            assert a[k] == v and a[k].dtype == np.int64, (k, a[k])
    tokens, meta = td.read_token_file("out/" + name)
    assert meta["num_documents"] == len(paths) and tokens.size == len(expect)
print("token files ok")
EOF

expect_error prepare_no_input 2 "$PYTHON" "$TOOLS/data/prepare_data.py" --out-dir bad
expect_error prepare_missing 2 "$PYTHON" "$TOOLS/data/prepare_data.py" corpus/nope.py --out-dir bad
expect_error prepare_empty_val 2 "$PYTHON" "$TOOLS/data/prepare_data.py" corpus/a.py corpus/b.txt --out-dir bad
expect_error prepare_bad_glob 2 "$PYTHON" "$TOOLS/data/prepare_data.py" "$WORK/nothing*/x" --out-dir bad
[ ! -e bad/train.h5 ] && [ ! -e bad/train.h5.tmp ] && pass "prepare_no_partial_files" || fail "prepare_no_partial_files"

# A larger corpus for the model runs: the standard library, as `make data` does.
check prepare_stdlib "$PYTHON" "$TOOLS/data/prepare_data.py" --stdlib --out-dir std
expect_error data_info_not_h5 2 "$PYTHON" "$TOOLS/data/tessera_data.py" info corpus/a.py

# --- AdamW and LR schedule against hand computation ------------------------------------------
check adamw_by_hand "$PYTHON" - <<'EOF'
import math, torch
import reference_train as rg      # the optimizer and schedule both parity references use

optim = dict(lr=0.1, min_lr=0.01, warmup_steps=2, decay_steps=6, weight_decay=0.5,
             beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=0.0)
# LR: warmup (s+1)/W, then cosine from lr to min_lr over steps W..D, flat after.
assert abs(rg.lr_at(0, optim, 100) - 0.05) < 1e-15 and abs(rg.lr_at(1, optim, 100) - 0.1) < 1e-15
assert abs(rg.lr_at(2, optim, 100) - 0.1) < 1e-15
assert abs(rg.lr_at(4, optim, 100) - 0.055) < 1e-15            # p = 0.5: halfway
assert abs(rg.lr_at(6, optim, 100) - 0.01) < 1e-15 and abs(rg.lr_at(50, optim, 100) - 0.01) < 1e-15
o2 = dict(optim, warmup_steps=0, decay_steps=0)                # decay over train.steps
assert abs(rg.lr_at(0, o2, 10) - 0.1) < 1e-15 and abs(rg.lr_at(5, o2, 10) - 0.055) < 1e-15

class Scalar(torch.nn.Module):          # a "matrix" (decayed) and a "bias" (not decayed)
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([[1.5]], dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.tensor([-0.5], dtype=torch.float64))

m = Scalar()
opt = rg.make_optimizer(m, optim)
assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
w, b = 1.5, -0.5
mw = vw = mb = vb = 0.0
grads = [(0.3, -0.2), (-1.0, 0.7), (0.25, 0.05), (2.0, -3.0)]
for t, (gw, gb) in enumerate(grads, start=1):
    lr = rg.lr_at(t - 1, optim, 100)
    m.w.grad = torch.tensor([[gw]], dtype=torch.float64)
    m.b.grad = torch.tensor([gb], dtype=torch.float64)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    def adam(p, m_, v_, g, wd):
        p = p * (1 - lr * wd)
        m_ = 0.9 * m_ + 0.1 * g
        v_ = 0.95 * v_ + 0.05 * g * g
        mhat, vhat = m_ / (1 - 0.9 ** t), v_ / (1 - 0.95 ** t)
        return p - lr * mhat / (math.sqrt(vhat) + 1e-8), m_, v_
    w, mw, vw = adam(w, mw, vw, gw, 0.5)
    b, mb, vb = adam(b, mb, vb, gb, 0.0)
    assert abs(m.w.item() - w) < 1e-12 and abs(m.b.item() - b) < 1e-12, (t, m.w.item(), w, m.b.item(), b)

# Resuming: a fresh optimizer given the moments and step continues identically.
m2 = Scalar()
with torch.no_grad():
    m2.w.copy_(m.w); m2.b.copy_(m.b)
opt2 = rg.make_optimizer(m2, optim)
st = {"w": opt.state[m.w], "b": opt.state[m.b]}
rg.load_adam_state(opt2, m2, {k: v["exp_avg"] for k, v in st.items()},
                   {k: v["exp_avg_sq"] for k, v in st.items()}, 4)
for o, mod in ((opt, m), (opt2, m2)):
    for g in o.param_groups:
        g["lr"] = 0.03
    mod.w.grad = torch.tensor([[0.1]], dtype=torch.float64)
    mod.b.grad = torch.tensor([0.2], dtype=torch.float64)
    o.step()
assert m.w.item() == m2.w.item() and m.b.item() == m2.b.item()
print("AdamW and LR schedule match the hand computation")
EOF

# --- the reference model ---------------------------------------------------------------------
check model_properties "$PYTHON" - <<'EOF'
import math, torch
import reference_gpt as rg
torch.manual_seed(0)
m = rg.GPT(2, 2, 16, 16, 320, 257)
rg.init_random(m, 0.02, 1)
keys = list(m.state_dict().keys())
import tessera_ckpt as tc         # the checkpoint's names, in tessera's order
shape = tc.shape_defaults(dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=257,
                               padded_vocab=320))
assert keys == [n for n, _ in tc.model_tensors(shape)], keys
x = torch.randint(0, 257, (3, 12)); y = torch.randint(0, 257, (3, 12))
loss = m(x, y).item()
assert abs(loss - math.log(257)) < 0.05, loss                    # small init: near-uniform
# Padded rows of wte never reach the logits.
with torch.no_grad():
    m.wte[257:] = 100.0
assert abs(m(x, y).item() - loss) < 1e-6
# Causal: changing the last input token leaves the loss of every earlier position unchanged.
def per_pos(inp):
    B, T = inp.shape
    return torch.stack([m(inp[:, :t + 1], y[:, :t + 1]) * (t + 1) for t in range(T)])
x2 = x.clone(); x2[:, -1] = (x2[:, -1] + 1) % 257
a, b = per_pos(x), per_pos(x2)
assert torch.allclose(a[:-1], b[:-1], atol=1e-6) and not torch.allclose(a[-1], b[-1])
# Attention against a per-head loop written independently.
att = m.h[0].attn
h = torch.randn(2, 5, 16)
qkv = h @ att.c_attn.weight.t() + att.c_attn.bias
out = []
for hd in range(2):
    q, k, v = (qkv[..., s * 16 + hd * 8: s * 16 + hd * 8 + 8] for s in range(3))
    w = torch.empty(2, 5, 5)
    for i in range(5):
        for j in range(5):
            w[:, i, j] = (q[:, i] * k[:, j]).sum(-1) / math.sqrt(8) if j <= i else -math.inf
    out.append(torch.softmax(w, -1) @ v)
ref = torch.cat(out, -1) @ att.c_proj.weight.t() + att.c_proj.bias
assert torch.allclose(att(h), ref, atol=1e-5)
print("model ok")
EOF

# The LLaMA reference's pieces against loops written independently: the rotary embedding as a
# 2x2 rotation of each pair (i, i + hs/2), grouped-query attention head by head, RMSNorm, SwiGLU;
# the names and shapes are the checkpoint's (tessera_ckpt.model_tensors), padded rows never reach
# a logit, and the model is causal.
check llama_model_properties "$PYTHON" - <<'EOF'
import math, torch
import reference_llama as rl, tessera_ckpt as tc
torch.manual_seed(0)
shape = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48,
             block_size=16, vocab_size=257, padded_vocab=320, tie_embeddings=0, norm_eps=1e-5,
             rope_theta=500.0)
m = rl.Llama(shape, 257)
with torch.no_grad():
    for p in m.parameters():
        p.copy_(torch.randn(p.shape) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
sd = m.state_dict()
assert [(k, tuple(v.shape)) for k, v in sd.items()] == tc.model_tensors(shape), list(sd)
x = torch.randint(0, 257, (3, 12)); y = torch.randint(0, 257, (3, 12))
loss = m(x, y).item()
with torch.no_grad():
    m.lm_head.weight[257:] = 100.0
    m.embed_tokens.weight[257:] = -100.0
assert abs(m(x, y).item() - loss) < 1e-6
x2 = x.clone(); x2[:, -1] = (x2[:, -1] + 1) % 257
def per_pos(inp):
    return torch.stack([m(inp[:, :t + 1], y[:, :t + 1]) * (t + 1) for t in range(inp.shape[1])])
a, b = per_pos(x), per_pos(x2)
assert torch.allclose(a[:-1], b[:-1], atol=1e-5) and not torch.allclose(a[-1], b[-1])
# One attention block, loop by loop.
att, T, hs = m.layers[0].self_attn.double(), 6, 8
h = torch.randn(2, T, 32, dtype=torch.float64)
q, k, v = h @ att.q_proj.weight.t(), h @ att.k_proj.weight.t(), h @ att.v_proj.weight.t()
def rotate(vec, t):          # (..., hs) at position t: pair (i, i + hs/2) turns by t * theta^(-2i/hs)
    out = vec.clone()
    for i in range(hs // 2):
        ang = t * 500.0 ** (-2 * i / hs)
        a_, b_ = vec[..., i], vec[..., i + hs // 2]
        out[..., i] = a_ * math.cos(ang) - b_ * math.sin(ang)
        out[..., i + hs // 2] = a_ * math.sin(ang) + b_ * math.cos(ang)
    return out
heads = []
for hd in range(4):
    kv = hd // 2                 # 4 query heads on 2 key/value heads
    qh = torch.stack([rotate(q[:, t, hd * hs:(hd + 1) * hs], t) for t in range(T)], 1)
    kh = torch.stack([rotate(k[:, t, kv * hs:(kv + 1) * hs], t) for t in range(T)], 1)
    vh = v[:, :, kv * hs:(kv + 1) * hs]
    w = torch.full((2, T, T), -math.inf, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            w[:, i, j] = (qh[:, i] * kh[:, j]).sum(-1) / math.sqrt(hs)
    heads.append(torch.softmax(w, -1) @ vh)
ref = torch.cat(heads, -1) @ att.o_proj.weight.t()
got = att(h)
assert torch.allclose(got, ref, atol=1e-5), (got - ref).abs().max()
# RMSNorm and the SwiGLU MLP.
n = m.layers[0].input_layernorm.double()
r = torch.randn(4, 32, dtype=torch.float64)
want = r / torch.sqrt((r * r).mean(-1, keepdim=True) + 1e-5) * n.weight
assert torch.allclose(n(r), want, atol=1e-12)
mlp = m.layers[0].mlp.double()
g_, u_ = r @ mlp.gate_proj.weight.t(), r @ mlp.up_proj.weight.t()
assert torch.allclose(mlp(r), (g_ / (1 + torch.exp(-g_)) * u_) @ mlp.down_proj.weight.t(), atol=1e-10)
print("llama model ok")
EOF

# --- a fake checkpoint, two steps end to end, and resume ------------------------------------
check make_checkpoint "$PYTHON" - <<'EOF'
import h5py, numpy as np, yaml, torch
import reference_gpt as rg, tessera_ckpt as tc
deck = {
    "model": dict(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=0, vocab_multiple=64, init_std=0.02),
    "data": dict(train="std/train.h5", val="std/val.h5", seq_len=16),
    "train": dict(steps=10, batch_size=4, micro_batch=2, seed=1337),
    "optim": dict(lr=1e-2, min_lr=1e-3, warmup_steps=1, decay_steps=0, weight_decay=0.1,
                  beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0),
    "eval": dict(every=0, batches=2),
    "checkpoint": dict(dir="", every=0, restart="none"),
    "log": dict(every=1, peak_gflops=0.0),
    "run": dict(dir="runs/test"),
    "device": dict(backend="cpu", threads=0),
}
m = rg.GPT(2, 2, 16, 32, 320, 257)
rg.init_random(m, 0.02, 7)
with torch.no_grad():
    for n, p in m.named_parameters():     # non-trivial biases and LayerNorms
        if p.dim() == 1:
            p.add_(0.01 * torch.randn(p.shape))
    m.wte[257:] = 0.0
with h5py.File("ckpt0.h5", "w") as f:
    f.attrs["format"] = np.bytes_("tessera-checkpoint")
    f.attrs["format_version"] = np.int64(1)
    f.attrs["step"] = np.int64(0)
    f.attrs["tokens_seen"] = np.int64(0)
    f.attrs["deck"] = yaml.safe_dump(deck)          # a str: h5py stores variable-length UTF-8
    f.attrs["software_version"] = np.bytes_("test")
    f.attrs["saved_layout"] = np.bytes_("dp=1 tp=1 pp=1")
    g = f.create_group("model")
    tc.write_shape(g.attrs, tc.shape_defaults(dict(n_layer=2, n_head=2, n_embd=16, block_size=32,
                                                   vocab_size=257, padded_vocab=320)))
    for n, t in m.state_dict().items():
        g.create_dataset(n, data=t.numpy())
        f.create_dataset(f"optim/exp_avg/{n}", data=np.zeros(t.shape, np.float32))
        f.create_dataset(f"optim/exp_avg_sq/{n}", data=np.zeros(t.shape, np.float32))
        for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            f.create_dataset(f"checksum/{grp}/{n}", data=np.uint64(tc.checksum(f[grp][n][...])))
    f["optim"].attrs["step"] = np.int64(0)
    tr = f.create_group("train")
    tr.attrs["next_sample"] = np.int64(0)
    tr.attrs["vocab_size"] = np.int64(257)
    tr.attrs["seed"] = np.int64(1337)
print("checkpoint written")
EOF

check reference_2_steps "$PYTHON" "$TOOLS/reference/reference_gpt.py" --checkpoint ckpt0.h5 --steps 2 --threads 2 \
  --out final2.h5 --losses-out losses2.json
check reference_output "$PYTHON" - <<'EOF'
import json, math, re, h5py, numpy as np
lines = [l for l in open("reference_2_steps.log") if l.startswith("step ")]
assert len(lines) == 2, lines
for i, l in enumerate(lines, 1):
    m = re.fullmatch(r"step (\d+) loss (\S+) lr (\S+) norm (\S+)\n", l)
    assert m and int(m.group(1)) == i, l
    assert all(math.isfinite(float(m.group(k))) for k in (2, 3, 4))
assert abs(float(lines[0].split()[5]) - 1e-2) < 1e-12      # warmup 1: step 0 runs at lr
losses = json.load(open("losses2.json"))
assert len(losses) == 2 and all(3.0 < v < 7.0 for v in losses), losses
assert abs(losses[0] - float(lines[0].split()[3])) < 1e-6
with h5py.File("final2.h5") as a, h5py.File("ckpt0.h5") as b:
    assert sorted(a["model"].keys()) == sorted(b["model"].keys())
    moved = [n for n in a["model"] if not np.array_equal(a["model"][n][...], b["model"][n][...])]
    assert len(moved) == len(a["model"]), "every tensor should change"
    assert a["model/wte"].dtype == np.float32 and a["model/wte"].shape == (320, 16)
print("reference output ok")
EOF

# The first step's loss, recomputed from the sample order with an independent loop.
check reference_first_loss "$PYTHON" - <<'EOF'
import json, h5py, numpy as np, torch
import reference_gpt as rg, tessera_data as td
tokens, _ = td.read_token_file("std/train.h5")
n = (tokens.size - 1) // 16
with h5py.File("ckpt0.h5") as f:
    sd = {k: torch.from_numpy(v[...]) for k, v in f["model"].items()}
m = rg.GPT(2, 2, 16, 32, 320, 257); m.load_state_dict(sd)
losses = []
for g in range(4):                              # step 0: global samples 0..3
    w = td.permute(g, n, 1337, 0)
    seq = torch.from_numpy(tokens[w * 16: w * 16 + 17].astype(np.int64))
    losses.append(m(seq[None, :-1], seq[None, 1:]).item())
ref = json.load(open("losses2.json"))[0]
assert abs(np.mean(losses) - ref) < 1e-5 * ref, (np.mean(losses), ref)
print("first loss ok", ref)
EOF

# Resume: one step, a checkpoint with its Adam state and next_sample, then one more step must
# land where two uninterrupted steps did.
check make_checkpoint_step1 "$PYTHON" - <<'EOF'
import shutil, h5py, numpy as np, torch
import reference_gpt as rg, reference_train as rt, tessera_ckpt as tc, tessera_data as td
torch.set_num_threads(2)  # as reference_2_steps: the sums' order follows the thread count
ck = rt.load_checkpoint("ckpt0.h5")
m = rg.build_model(ck, "ckpt0.h5")
rt.load_weights(m, ck["model"], "ckpt0.h5")
opt = rt.make_optimizer(m, ck["deck"]["optim"])
torch.use_deterministic_algorithms(True)
tokens, _ = td.read_token_file("std/train.h5")
batches = td.train_step_batches(tokens, 16, 0, 4, 2, 1337, 0)
rt.train_step(m, opt, batches, rt.lr_at(0, ck["deck"]["optim"], 10), 1.0)
shutil.copy("ckpt0.h5", "ckpt1.h5")
with h5py.File("ckpt1.h5", "r+") as f:
    f.attrs["step"] = np.int64(1)
    for n, p in m.named_parameters():
        f["model"][n][...] = p.detach().numpy()
        f["optim/exp_avg"][n][...] = opt.state[p]["exp_avg"].numpy()
        f["optim/exp_avg_sq"][n][...] = opt.state[p]["exp_avg_sq"].numpy()
        for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            f[f"checksum/{grp}/{n}"][()] = np.uint64(tc.checksum(f[grp][n][...]))
    f["optim"].attrs["step"] = np.int64(1)
    f["train"].attrs["next_sample"] = np.int64(4)
    # String attributes may come back as bytes: store the deck as fixed-length ASCII here.
    deck = f.attrs["deck"]
    f.attrs["deck"] = np.bytes_(deck.encode() if isinstance(deck, str) else deck)
print("step-1 checkpoint written")
EOF
check reference_resume "$PYTHON" "$TOOLS/reference/reference_gpt.py" --checkpoint ckpt1.h5 --steps 1 --threads 2 \
  --data std/train.h5 --out final_resumed.h5 --losses-out losses_resumed.json
check resume_matches "$PYTHON" - <<'EOF'
import json, h5py, numpy as np
a, b = json.load(open("losses2.json")), json.load(open("losses_resumed.json"))
assert abs(a[1] - b[0]) <= 1e-6 * abs(a[1]), (a, b)
line = [l for l in open("reference_resume.log") if l.startswith("step ")]
assert len(line) == 1 and line[0].startswith("step 2 "), line
with h5py.File("final2.h5") as x, h5py.File("final_resumed.h5") as y:
    for n in x["model"]:
        d = np.max(np.abs(x["model"][n][...] - y["model"][n][...]))
        assert d <= 1e-6 * np.max(np.abs(x["model"][n][...])), (n, d)
print("resume ok")
EOF

# --- compare_parity --------------------------------------------------------------------------
"$PYTHON" - <<'EOF'
import json, shutil, h5py
losses = json.load(open("losses2.json"))
with open("metrics_ok.jsonl", "w") as f:
    f.write(json.dumps({"type": "start", "world": 1}) + "\n")
    for i, l in enumerate(losses, 1):
        f.write(json.dumps({"type": "train", "step": i, "loss": l * (1 + 2e-6), "lr": 0.01}) + "\n")
    f.write(json.dumps({"type": "eval", "step": 2, "loss": 9.0}) + "\n")
with open("metrics_bad.jsonl", "w") as f:
    for i, l in enumerate(losses, 1):
        f.write(json.dumps({"type": "train", "step": i, "loss": l * (1 + (1e-3 if i == 2 else 0))}) + "\n")
with open("metrics_short.jsonl", "w") as f:
    f.write(json.dumps({"type": "train", "step": 1, "loss": losses[0]}) + "\n")
with open("metrics_resumed.jsonl", "w") as f:
    # Step 1 belongs to an earlier job (ignored with --first-step 2); step 2 was rolled back and
    # repeated (the last value counts); steps 2..3 pair with the reference's two losses.
    for step, l in [(1, 9.0), (2, 9.0), (2, losses[0]), (3, losses[1])]:
        f.write(json.dumps({"type": "train", "step": step, "loss": l}) + "\n")
shutil.copy("final2.h5", "tessera_ok.h5")
shutil.copy("final2.h5", "tessera_perturbed.h5")
with h5py.File("tessera_perturbed.h5", "r+") as f:
    f["model/h.1.mlp.c_fc.weight"][0, 0] += 0.01
shutil.copy("final2.h5", "tessera_missing.h5")
with h5py.File("tessera_missing.h5", "r+") as f:
    del f["model/ln_f.bias"]
EOF
CP=("$PYTHON" "$TOOLS/reference/compare_parity.py" --losses losses2.json --reference final2.h5)
check parity_pass "${CP[@]}" --metrics metrics_ok.jsonl --checkpoint tessera_ok.h5
expect_code() {  # NAME CODE CMD...
  local name=$1 code=$2; shift 2
  "$@" >"$WORK/$name.log" 2>&1; local rc=$?
  if [ "$rc" -eq "$code" ] && ! grep -q Traceback "$WORK/$name.log"; then pass "$name (exit $rc)"
  else fail "$name (exit $rc, expected $code)"; sed 's/^/    /' "$WORK/$name.log"; fi
}
expect_code parity_loss_fail 1 "${CP[@]}" --metrics metrics_bad.jsonl --checkpoint tessera_ok.h5
expect_code parity_param_fail 1 "${CP[@]}" --metrics metrics_ok.jsonl --checkpoint tessera_perturbed.h5
expect_code parity_missing_tensor 1 "${CP[@]}" --metrics metrics_ok.jsonl --checkpoint tessera_missing.h5
expect_code parity_step_count 1 "${CP[@]}" --metrics metrics_short.jsonl --checkpoint tessera_ok.h5
expect_code parity_first_step_short 1 "${CP[@]}" --metrics metrics_ok.jsonl --checkpoint tessera_ok.h5 --first-step 2
check parity_first_step "${CP[@]}" --metrics metrics_resumed.jsonl --checkpoint tessera_ok.h5 --first-step 2
grep -q "FAIL" parity_loss_fail.log && grep -q "h.1.mlp.c_fc.weight.*FAIL" parity_param_fail.log \
  && pass "parity_reports_what_failed" || fail "parity_reports_what_failed"
expect_error parity_no_metrics 1 "${CP[@]}" --metrics nope.jsonl --checkpoint tessera_ok.h5

# --- bench mode and errors -------------------------------------------------------------------
check bench "$PYTHON" "$TOOLS/reference/reference_gpt.py" --bench --n-layer 1 --n-head 2 --n-embd 32 --vocab 100 \
  --seq 8 --batch 2 --steps 2 --threads 1
grep -Eq '^tokens_per_second [0-9.]+$' bench.log && pass "bench_output" || { fail "bench_output"; cat bench.log; }
# make bench-gpu's PyTorch half on the CPU, tiny shapes of both families: the masked-attention
# rows run here (this PyTorch may lack sdpa and torch.compile: those rows say they failed), in
# the order of their value, and --budget stops it starting rows.
"$PYTHON" "$TOOLS/bench/gpu_torch.py" --peak-tflops 1 --device cpu --shapes tiny,llama-tiny \
  --steps 1 >gpu_torch.log 2>&1
if [ "$(grep -Ec '^\| (tiny|LLaMA tiny) \(L=2 .* \| bf16 \| masked \| [0-9.]+ \| [0-9]+ \|' gpu_torch.log)" = 2 ] &&
   [ "$(grep -c '^| ' gpu_torch.log)" = 13 ] &&
   "$PYTHON" "$TOOLS/bench/gpu_torch.py" --peak-tflops 1 --device cpu --shapes tiny --steps 1 \
     --budget 0.001 2>&1 | grep -q 'the budget of 0 s was spent after 1 of 6 rows'; then
  pass "gpu_torch: $(grep -c '^| ' gpu_torch.log) table lines, GPT-2 and LLaMA rows"
else
  fail "gpu_torch"; head -20 gpu_torch.log
fi
expect_error reference_missing_ckpt 1 "$PYTHON" "$TOOLS/reference/reference_gpt.py" --checkpoint nope.h5 --steps 1
expect_error reference_not_checkpoint 2 "$PYTHON" "$TOOLS/reference/reference_gpt.py" --checkpoint std/train.h5 --steps 1
expect_error reference_missing_data 1 "$PYTHON" "$TOOLS/reference/reference_gpt.py" --checkpoint ckpt0.h5 --steps 1 --data nope.h5
expect_error reference_llama_on_gpt2 2 "$PYTHON" "$TOOLS/reference/reference_llama.py" --checkpoint ckpt0.h5 --steps 1

if [ "$FAILS" -eq 0 ]; then echo "test_tools: all passed"; exit 0; fi
echo "test_tools: $FAILS failed"; exit 1
