#!/usr/bin/env bash
# tools/runs/plot_run.py: two runs overlaid in one PNG; the points plotted are the logged ones (against
# step and tokens, tokens counted from deck.yaml for metrics that predate the field); bad input is
# one line, exit 2.
source "$(dirname "$0")/lib.sh"
PLOT="$PYTHON $ROOT/tools/runs/plot_run.py"
deck=$(tiny_deck pa)
cd "$WORK" || exit 1
"$TESSERA" train "$deck" train.steps=6 eval.every=3 >pa.log 2>&1 || fail "train run pa"
"$TESSERA" train "$deck" train.steps=6 eval.every=3 optim.lr=1e-3 run.dir="$WORK/pb" >pb.log 2>&1 || fail "train run pb"
if $PLOT pa pb --out both.png --series-out series.json >plot.log 2>&1 &&
   grep -q "plot_run: wrote both.png (2 runs, up to 6 logged steps)" plot.log; then
  pass "plot of 2 runs: $(cat plot.log)"
else
  fail "plot_run"; cat plot.log
fi
if "$PYTHON" - both.png series.json pa/metrics.jsonl pb/metrics.jsonl <<'PY'
import json, struct, sys
png = open(sys.argv[1], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", "not a PNG"
w, h = struct.unpack(">II", png[16:24])
assert (w, h) == (720, 1058), (w, h)      # 10 x 14.7 inches at 72 dpi: 7 rows (the breakdown's last), 2 columns
series = json.load(open(sys.argv[2]))
for name, metrics in zip(("pa", "pb"), sys.argv[3:]):
    rec = [json.loads(l) for l in open(metrics)]
    train = [r for r in rec if r["type"] == "train"]
    val = [r for r in rec if r["type"] == "eval"]
    s = series[name]
    assert [p[2] for p in s["loss"]] == [r["loss"] for r in train], name
    assert [p[1] for p in s["loss"]] == [r["step"] * 4 * 16 for r in train], name   # B x T
    assert [p[0] for p in s["val_loss"]] == [0, 3, 6] and len(val) == 3, s["val_loss"]
    assert [p[2] for p in s["mfu"]] == [100 * r["mfu"] for r in train]
    for key in ("lr", "grad_norm", "tokens_per_s", "data_wait"):
        assert len(s[key]) == 6, key
    # The breakdown row's points: every kind of every line, the step's own time left out.
    for kind in train[-1]["breakdown_ms"]:
        points = s["breakdown_ms"].get(kind, [])
        assert kind == "step" or [p[2] for p in points] == [r["breakdown_ms"][kind] for r in train], kind
assert series["pa"]["lr"] != series["pb"]["lr"]
PY
then pass "the PNG is 720x1058, and every plotted point is a logged one (loss, val_loss, tokens, MFU, breakdown)"
else fail "plotted points"; fi
# Metrics from before the tokens field: tokens come from deck.yaml (batch_size x seq_len).
mkdir -p old && cp pa/deck.yaml old/ && sed 's/"tokens":[0-9]*,//' pa/metrics.jsonl >old/metrics.jsonl
if $PLOT old --out old.png --series-out old.json >/dev/null 2>&1 &&
   "$PYTHON" -c 'import json; s=json.load(open("old.json"))["old"]["loss"]; assert [p[1] for p in s]==[p[0]*64 for p in s], s'; then
  pass "metrics without tokens: counted from deck.yaml"
else
  fail "metrics without tokens"
fi
# A mixture of experts gains the expert-load row: each point the worst layer's moe_load.
"$TESSERA" train "$deck" train.steps=4 model.moe.experts=4 model.moe.top_k=2 run.dir="$WORK/pm" \
  >pm.log 2>&1 || fail "train run pm"
if $PLOT pa pm --out moe.png --series-out moe.json >/dev/null 2>&1 &&
   "$PYTHON" - <<'PY'
import json
s = json.load(open("moe.json"))
logged = [json.loads(l) for l in open("pm/metrics.jsonl")]
want = [max(r["moe_load"]) for r in logged if r.get("type") == "train"]
assert [p[2] for p in s["pm"]["moe_load_max"]] == want, (s["pm"]["moe_load_max"], want)
assert s["pa"]["moe_load_max"] == [], s["pa"]
PY
then pass "an MoE run's expert-load row: the worst layer's max/mean at every logged step"
else fail "expert-load row"; fi
mkdir -p empty bad && cp pa/metrics.jsonl bad/ && echo '{"type": "train", "step"' >>bad/metrics.jsonl
expect_error "no metrics.jsonl" 2 "empty: no metrics.jsonl" $PLOT empty --out x.png
expect_error "a broken JSON line" 2 "bad/metrics.jsonl:[0-9]+: not a JSON line" $PLOT bad --out x.png
[ ! -e x.png ] && pass "nothing written on bad input" || fail "x.png written on bad input"
finish
