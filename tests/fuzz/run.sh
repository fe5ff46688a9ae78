#!/usr/bin/env bash
# `make fuzz`: runs bin/fuzz_TARGET for SECONDS of fuzzing from its kept corpus. libFuzzer stops
# at its first finding; this goes on from where it stopped until the time is used, so one
# finding does not end the run. Each finding is kept under build-fuzz/findings/TARGET/ (not in
# the kept corpus: that must replay clean, and is where a finding goes once it is fixed).
# Ends with one line: executions, corpus growth and findings.
#   tests/fuzz/run.sh TARGET SECONDS
set -u
target=$1 seconds=$2
corpus=build-fuzz/corpus/$target findings=build-fuzz/findings/$target log=build-fuzz/$target.log
mkdir -p "$corpus" "$findings"
: >"$log"
# Stacks unwound in full (fast unwinding stops inside libraries built without frame pointers,
# and tests/lsan.supp names libhdf5's functions); huge allocations a damaged file asks libhdf5
# for fail as they would without ASan.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:fast_unwind_on_malloc=0
export LSAN_OPTIONS=suppressions=tests/lsan.supp
start=$SECONDS execs=0 runs=0
while [ $((SECONDS - start)) -lt "$seconds" ] && [ "$runs" -lt 50 ]; do
  runs=$((runs + 1))
  "bin/fuzz_$target" -max_total_time=$((seconds - (SECONDS - start))) -timeout=10 -rss_limit_mb=4096 \
    -malloc_limit_mb=4000000 -print_final_stats=1 -artifact_prefix="$findings/" \
    "$corpus" "tests/fuzz/corpus/$target" >"$log.run" 2>&1
  cat "$log.run" >>"$log"
  n=$(awk '/^stat::number_of_executed_units:/ {n = $2} END {print n}' "$log.run")
  execs=$((execs + ${n:-0}))
  grep -E "^==[0-9]+==ERROR|^SUMMARY|Test unit written" "$log.run"
done
rm -f "$log.run"
fuzzed=$((SECONDS - start))
# A finding written by a contained child (src/io/contained.cpp: libhdf5 crashed there, and the
# reader refused the file with one line) replays clean: counted apart from those that do not.
found=0 contained=0
mkdir -p "$findings/contained"
for f in "$findings"/*; do
  [ -f "$f" ] || continue
  if "bin/fuzz_$target" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=4000000 "$f" >/dev/null 2>&1; then
    mv "$f" "$findings/contained/"
    contained=$((contained + 1))
  else
    found=$((found + 1))
  fi
done
echo "fuzz: $target: $execs executions in $fuzzed s ($runs runs), corpus $(find "$corpus" -type f | wc -l) inputs, $found findings in $findings, $contained contained (libhdf5 crashed in the reader's child process, the file refused with one line)"
