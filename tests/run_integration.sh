#!/usr/bin/env bash
# Runs every tests/integration/test_*.sh (each prints PASS/FAIL lines and exits non-zero on a
# failure) and closes with one "N passed, M failed" line. Usage: bash tests/run_integration.sh [NAME...]
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYTHON=${PYTHON:-/usr/bin/python3} MPIEXEC=${MPIEXEC:-mpiexec}
passed=0 failed=0 failed_scripts=""
scripts=("$@")
[ ${#scripts[@]} -gt 0 ] || scripts=("$ROOT"/tests/integration/test_*.sh)
for script in "${scripts[@]}"; do
  [ -f "$script" ] || script=$ROOT/tests/integration/$script
  name=$(basename "$script" .sh)
  echo "=== $name"
  start=$(date +%s)
  log=$(mktemp)
  bash "$script" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  p=$(grep -c '^PASS' "$log"); f=$(grep -c '^FAIL' "$log")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name exited $rc"; fi
  passed=$((passed + p)); failed=$((failed + f))
  [ "$f" -eq 0 ] || failed_scripts="$failed_scripts $name"
  echo "=== $name: $p passed, $f failed ($(( $(date +%s) - start )) s)"
  rm -f "$log"
done
[ -z "$failed_scripts" ] || echo "failing:$failed_scripts"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
