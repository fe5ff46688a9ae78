#!/usr/bin/env bash
# The documentation's house rules (tests/integration/docs_check.py): README.md, docs/*.md and the
# READMEs of input/, jobscripts/ and tests/fuzz/ as they are pass, and each kind of breach planted
# in a copy of them fails, naming the page and line: a link to a file that is not there, a link or
# a path that leaves the repository (the design page outside it that every clone lacked), a path
# to a tool that moved, an anchor with no heading, a page of docs/ the README does not link, a
# test script docs/tests.md does not list, and a README over 300 lines.
# Usage: PYTHON=/usr/bin/python3 bash tests/integration/test_docs.sh
source "$(dirname "$0")/lib.sh"
CHECK=$ROOT/tests/integration/docs_check.py

if out=$("$PYTHON" "$CHECK" "$ROOT" 2>&1); then pass "docs: $out"
else fail "the documentation breaks its rules:"; echo "$out" | sed 's/^/    /'; fi

# A copy of what the pages name: the pages themselves and the folders their paths point into.
fresh() {
  rm -rf "$WORK/repo" && mkdir -p "$WORK/repo"
  local d
  for d in README.md docs src tests tools input jobscripts .ci; do
    [ -e "$ROOT/$d" ] && cp -r "$ROOT/$d" "$WORK/repo/"
  done
}
# planted NAME EXPECTED: the check over the changed copy must fail with a line matching EXPECTED.
planted() {
  local name=$1 expected=$2 out rc
  out=$("$PYTHON" "$CHECK" "$WORK/repo" 2>&1); rc=$?
  if [ "$rc" -ne 0 ] && echo "$out" | grep -q -- "$expected"; then
    pass "$name: $(echo "$out" | grep -- "$expected" | head -n1)"
  else
    fail "$name (exit $rc)"; echo "$out" | sed 's/^/    /'
  fi
}

fresh
printf '\nSee [the loader](loader.md).\n' >>"$WORK/repo/docs/data.md"
planted "a dead link" "docs/data.md:[0-9]*: link loader.md: no such file"

fresh
printf '\nThe design is in `../shared/DESIGN.md`.\n' >>"$WORK/repo/README.md"
planted "a path outside the repository" "README.md:[0-9]*: points outside the repository: ../shared/DESIGN.md"

fresh
printf '\nMore: [the design](../DESIGN.md).\n' >>"$WORK/repo/README.md"
planted "a link that climbs out" "README.md:[0-9]*: link ../DESIGN.md: outside the repository"

fresh
printf '\n    python3 tools/prepare_data.py --stdlib --out-dir data/x\n' >>"$WORK/repo/input/README.md"
planted "a tool's old path" "input/README.md:[0-9]*: tools/prepare_data.py: no such file or folder"

fresh
printf '\nSee [the ring](parallelism.md#the-ring-that-is-not-there).\n' >>"$WORK/repo/docs/models.md"
planted "an anchor with no heading" "docs/models.md:[0-9]*: link parallelism.md#the-ring-that-is-not-there: no heading"

fresh
printf '# Orphan\n\nA page nobody links.\n' >"$WORK/repo/docs/orphan.md"
planted "a page the README does not link" "docs/orphan.md: not linked from README.md"

fresh
printf '#!/usr/bin/env bash\n' >"$WORK/repo/tests/integration/test_unlisted.sh"
planted "a test script docs/tests.md does not list" "docs/tests.md: tests/integration/test_unlisted.sh is not listed"

fresh
for _ in $(seq 300); do echo "padding" >>"$WORK/repo/README.md"; done
planted "a README over 300 lines" "README.md: [0-9]* lines, more than 300"

finish
