#!/usr/bin/env bash
# Every deck error is one line "deck.yaml:LINE:COL: key: problem", exit status 2, nothing else
# printed and nothing written.
source "$(dirname "$0")/lib.sh"
base=$(tiny_deck base)
cd "$WORK" || exit 1

# bad_deck NAME PATTERN: writes $WORK/NAME.yaml from stdin and expects the error.
bad_deck() {
  local name=$1 pattern=$2
  cat >"$WORK/$name.yaml"
  expect_error "$name" 2 "$pattern" "$TESSERA" train "$WORK/$name.yaml"
  if [ -e "$WORK/run_$name" ]; then fail "$name left a run directory"; fi
}

bad_deck unknown_key '^.*/unknown_key\.yaml:3:3: model\.n_layers: unknown key \(did you mean model\.n_layer\?\)$' <<EOF
model:
  n_head: 2
  n_layers: 4
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_unknown_key
EOF

bad_deck unknown_section '^.*:1:1: .*modle.*did you mean model' <<EOF
modle:
  n_head: 2
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_unknown_section
EOF

bad_deck duplicate_key '^.*/duplicate_key\.yaml:3:3: train\.steps: duplicate key' <<EOF
train:
  steps: 10
  steps: 20
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_duplicate_key
EOF

bad_deck wrong_type '^.*/wrong_type\.yaml:2:10: train\.steps: expected an integer' <<EOF
train:
  steps: ten
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_wrong_type
EOF

bad_deck float_for_int '^.*:2:12: model\.n_layer: expected an integer' <<EOF
model:
  n_layer: 1.5
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_float_for_int
EOF

bad_deck out_of_range '^.*:2:7: optim\.lr: .*' <<EOF
optim:
  lr: -1.0
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_out_of_range
EOF

bad_deck heads_do_not_divide '^.*: model\.(n_embd|n_head): .*(100.*3|3.*100)' <<EOF
model:
  n_embd: 100
  n_head: 3
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_heads_do_not_divide
EOF

bad_deck seq_over_block '^.*: data\.seq_len: .*64.*32' <<EOF
model:
  block_size: 32
data:
  train: $DATA/train.h5
  seq_len: 64
run:
  dir: $WORK/run_seq_over_block
EOF

bad_deck missing_required 'data\.train' <<EOF
train:
  steps: 3
run:
  dir: $WORK/run_missing_required
EOF

bad_deck yaml_syntax '^.*/yaml_syntax\.yaml:[0-9]+:[0-9]+: ' <<EOF
model: [n_layer: 2
data:
  train: x
EOF

bad_deck bad_backend '^.*: device\.backend: .*gpu' <<EOF
device:
  backend: gpu
data:
  train: $DATA/train.h5
run:
  dir: $WORK/run_bad_backend
EOF

# Overrides are checked the same way.
expect_error override_unknown 2 '^command line: train\.stpes=5: .*did you mean train\.steps' \
  "$TESSERA" train "$base" train.stpes=5
expect_error override_type 2 '^command line: train\.steps=abc: .*integer' \
  "$TESSERA" train "$base" train.steps=abc
expect_error override_no_equals 2 '^command line: train\.steps: ' \
  "$TESSERA" train "$base" train.steps
expect_error missing_deck 1 'cannot read deck .*nope\.yaml' "$TESSERA" train "$WORK/nope.yaml"
expect_error no_command 2 'unknown command' "$TESSERA" trian "$base"

# A good override wins over the deck, and the resolved deck lands in the run directory.
if "$TESSERA" train "$base" train.steps=2 log.every=1 >"$WORK/ok.log" 2>&1 &&
   grep -q '^step *2/2' "$WORK/ok.log" && grep -Eq '^ +steps: 2$' "$WORK/base/deck.yaml"; then
  pass "override train.steps=2 applied and resolved deck written"
else
  fail "override run"; sed 's/^/    /' "$WORK/ok.log" | tail -5
fi

# Help texts.
if "$TESSERA" --help | grep -q 'tessera train' && "$TESSERA" train --help | grep -q 'metrics.jsonl'; then
  pass "tessera --help and tessera train --help"
else
  fail "help texts"
fi
finish
