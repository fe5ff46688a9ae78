#!/usr/bin/env bash
# The rank mesh on real ranks: builds tests/mpi/topology_check.cpp and runs it for (dp, tp, pp) =
# (2,2,2) on 8 ranks, (1,1,4), (4,1,1), (auto,2,1) on 4, and dp 2 x cp 2 x tp 2 with ZeRO groups of
# 2 on 8. Every rank checks the members and order of every group of the mesh (each set of
# dimensions, ZeRO's shard and replica, embed) against the rank formula and against brute force;
# a layout that does not fit the job is refused with the numbers.
source "$(dirname "$0")/lib.sh"
cd "$ROOT" || exit 1

CHECK=$ROOT/build/tests/mpi/topology_check
mkdir -p "$(dirname "$CHECK")"
# The Makefile's flags, on just the files the check needs.
if ! ${CXX:-g++} -std=c++20 -O2 -fopenmp -Wall -Wextra -Werror -Isrc $(pkg-config --cflags mpich) \
    src/parallel/layout.cpp src/parallel/mesh_shape.cpp src/parallel/mesh.cpp \
    tests/mpi/topology_check.cpp -o "$CHECK" \
    $(pkg-config --libs mpich) >"$WORK/build.txt" 2>&1; then
  fail "build topology_check"
  head -20 "$WORK/build.txt"
  finish
fi

# run_check NAME NP DP TP PP N_LAYER: the check passes on NP ranks; its output is in $WORK/NAME.txt.
run_check() {
  local name=$1 np=$2
  shift 2
  timeout 60 $MPIEXEC -n "$np" "$CHECK" "$@" >"$WORK/$name.txt" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ] && grep -q ", 0 problems$" "$WORK/$name.txt"; then
    pass "$name: $(tail -1 "$WORK/$name.txt")"
  else
    fail "$name: exit $rc"
    grep -v '^rank [0-9]*: dp' "$WORK/$name.txt" | head -20 | sed 's/^/    /'
  fi
}

run_check "dp2_tp2_pp2" 8 2 2 2 4
# The grid rank 0 prints: tp fastest, then dp, then pp; wte/wpe on the first stage, ln_f and the
# wte copy on the last.
cat >"$WORK/grid_want.txt" <<'EOF'
rank 0: dp 0 tp 0 pp 0  layers 0-1 (+ wte, wpe)
rank 1: dp 0 tp 1 pp 0  layers 0-1 (+ wte, wpe)
rank 2: dp 1 tp 0 pp 0  layers 0-1 (+ wte, wpe)
rank 3: dp 1 tp 1 pp 0  layers 0-1 (+ wte, wpe)
rank 4: dp 0 tp 0 pp 1  layers 2-3 (+ wte copy, ln_f)
rank 5: dp 0 tp 1 pp 1  layers 2-3 (+ wte copy, ln_f)
rank 6: dp 1 tp 0 pp 1  layers 2-3 (+ wte copy, ln_f)
rank 7: dp 1 tp 1 pp 1  layers 2-3 (+ wte copy, ln_f)
EOF
grep '^rank [0-9]*: dp' "$WORK/dp2_tp2_pp2.txt" >"$WORK/grid_got.txt"
if cmp -s "$WORK/grid_want.txt" "$WORK/grid_got.txt"; then
  pass "dp2_tp2_pp2: rank grid"
else
  fail "dp2_tp2_pp2: rank grid differs"
  diff "$WORK/grid_want.txt" "$WORK/grid_got.txt" | head -20 | sed 's/^/    /'
fi

run_check "dp1_tp1_pp4" 4 1 1 4 6
if grep -q '^rank 3: dp 0 tp 0 pp 3  layer 5 (+ wte copy, ln_f)$' "$WORK/dp1_tp1_pp4.txt" &&
   grep -q '^rank 1: dp 0 tp 0 pp 1  layers 2-3$' "$WORK/dp1_tp1_pp4.txt"; then
  pass "dp1_tp1_pp4: balanced stages 2,2,1,1 in the grid"
else
  fail "dp1_tp1_pp4: grid"
  sed 's/^/    /' "$WORK/dp1_tp1_pp4.txt" | head -10
fi
run_check "dp4_tp1_pp1" 4 4 1 1 2
run_check "dp2_cp2_tp2_zero_group2" 8 2 2 1 2 2 2
if grep -q '^rank 5: dp 1 cp 0 tp 1 pp 0  layers 0-1' "$WORK/dp2_cp2_tp2_zero_group2.txt" &&
   grep -q ', 30 groups, 0 problems$' "$WORK/dp2_cp2_tp2_zero_group2.txt"; then
  pass "dp2_cp2_tp2_zero_group2: cp in the grid, the 15 groups of the base and the 15 of ZeRO's view"
else
  fail "dp2_cp2_tp2_zero_group2: grid or group count"
  tail -3 "$WORK/dp2_cp2_tp2_zero_group2.txt" | sed 's/^/    /'
fi
run_check "dp_auto_tp2_pp1" 4 auto 2 1 2
if grep -q '^checked dp=2 tp=2 pp=1 on 4 ranks' "$WORK/dp_auto_tp2_pp1.txt"; then
  pass "dp=auto resolved to 2 on 4 ranks"
else
  fail "dp=auto did not resolve to 2"
fi

# A layout that does not fit the job: refused before any communicator is made.
timeout 60 $MPIEXEC -n 4 "$CHECK" 2 2 2 4 >"$WORK/bad.txt" 2>&1
rc=$?
if [ "$rc" -ne 0 ] &&
   grep -qx 'parallel: dp=2 x tp=2 x pp=2 = 8 ranks, but the job has 4' "$WORK/bad.txt"; then
  pass "(2,2,2) on 4 ranks refused: $(head -1 "$WORK/bad.txt")"
else
  fail "(2,2,2) on 4 ranks: exit $rc"
  head -5 "$WORK/bad.txt" | sed 's/^/    /'
fi
finish
