# `pipetrain diff`: identical files, files within a tolerance, and files whose tensor sets
# differ, where every tensor only one file holds and every shape that differs is named.
source "$(dirname "$0")/lib/common.bash"
T=(--train-samples 128 --test-samples 0 --steps 1 --batch 32 --threads 1 --optimizer sgd)
# A: layers 0, 1, 2 with parameters. B: layer 1 is a dropout (no parameters), layer 0 is
# narrower, and layer 3 exists only in B.
printf '[net]\n[dense]\nunits=32\n[dense]\nunits=16\n[dense]\nunits=10\n' >"$WORK/a.cfg"
printf '[net]\n[dense]\nunits=24\n[dropout]\np=0.1\n[dense]\nunits=10\n[dense]\nunits=10\n' \
    >"$WORK/b.cfg"
"$PIPETRAIN" train --model "$WORK/a.cfg" "${T[@]}" --save "$WORK/a.st" >/dev/null
"$PIPETRAIN" train --model "$WORK/a.cfg" "${T[@]}" --save "$WORK/a2.st" >/dev/null
"$PIPETRAIN" train --model "$WORK/a.cfg" "${T[@]}" --seed 1 --save "$WORK/a3.st" >/dev/null
"$PIPETRAIN" train --model "$WORK/b.cfg" "${T[@]}" --save "$WORK/b.st" >/dev/null

if "$PIPETRAIN" diff "$WORK/a.st" "$WORK/a2.st" >"$WORK/out" && grep -q '^IDENTICAL' "$WORK/out"
then pass "the same run twice is identical"; else failed "identical files:"; cat "$WORK/out"; fi

rc=0
"$PIPETRAIN" diff "$WORK/a.st" "$WORK/a3.st" >"$WORK/out" || rc=$?
[ "$rc" -eq 1 ] && grep -q 'EXCEEDS' "$WORK/out" && pass "another seed differs (exit 1)" \
    || { failed "another seed: exit $rc"; cat "$WORK/out"; }

rc=0
"$PIPETRAIN" diff "$WORK/a.st" "$WORK/b.st" >"$WORK/out" || rc=$?
cat "$WORK/out"
[ "$rc" -eq 1 ] && pass "different tensor sets: exit 1" || failed "different tensor sets: exit $rc"
# expect LINE_REGEX WHAT: a line of the output matches
expect_line() {
    if grep -Eq -- "$1" "$WORK/out"; then pass "$2: $(grep -Em1 -- "$1" "$WORK/out")"
    else failed "$2: no line matches /$1/"; fi
}
expect_line '^layers\.0\.weight +shape differs: A \[32, 784\] vs B \[24, 784\]$' "shape differs"
expect_line '^layers\.0\.bias +shape differs: A \[32\] vs B \[24\]$' "shape differs (bias)"
expect_line '^layers\.1\.weight +only in A: \[16, 32\]$' "only in A"
expect_line '^layers\.1\.bias +only in A: \[16\]$' "only in A (bias)"
expect_line '^layers\.3\.weight +only in B: \[10, 10\]$' "only in B"
expect_line '^layers\.3\.bias +only in B: \[10\]$' "only in B (bias)"
expect_line '^layers\.2\.weight +shape differs: A \[10, 16\] vs B \[10, 24\]$' "shape differs (2)"
expect_line '2 only in A, 2 only in B, 3 with different shapes' "the summary counts them"
expect_line '^layers\.2\.bias +10 values' "a tensor both hold is still compared"
expect_line '^DIFFERENT' "the verdict"

expect_fail "one file" "2 files are needed, 1 given" "$PIPETRAIN" diff "$WORK/a.st"
expect_fail "three files" "unexpected argument" \
    "$PIPETRAIN" diff "$WORK/a.st" "$WORK/a.st" "$WORK/a.st"
expect_fail "bad tolerance" "--rtol x: not a number" \
    "$PIPETRAIN" diff "$WORK/a.st" "$WORK/a.st" --rtol x
finish
