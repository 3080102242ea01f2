# Every command's options come from one table that also prints its help (src/base/options.h):
# every command answers --help and -h, refuses unknown options the same way, and the
# options several commands share have the same letter, text and default in each.
# `pipetrain --version` and `pipetrain version` print the CMake project version.
source "$(dirname "$0")/lib/common.bash"
COMMANDS=(train summary partition schedule topo plan devices diff launch)

for c in "${COMMANDS[@]}"; do
    rc=0
    "$PIPETRAIN" "$c" --help >"$WORK/help.$c" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^usage: pipetrain $c" "$WORK/help.$c" && [ ! -s "$WORK/err" ]
    then pass "$c --help"; else failed "$c --help: exit $rc"; cat "$WORK/help.$c" "$WORK/err"; fi
    "$PIPETRAIN" "$c" -h >"$WORK/h" 2>&1 && cmp -s "$WORK/h" "$WORK/help.$c" \
        && pass "$c -h is --help" || failed "$c -h differs from --help"
    expect_fail "$c: unknown option" "unknown option --frobnicate (see pipetrain $c --help)" \
        "$PIPETRAIN" "$c" --frobnicate
done

"$PIPETRAIN" --help >"$WORK/help.pipetrain" && grep -q "^  version " "$WORK/help.pipetrain" \
    && pass "pipetrain --help lists the commands" || failed "pipetrain --help"

# The help texts agree: a shared option has one letter, one text and one default; no
# letter means two things; no line is wider than 80 columns.
if python3 - "$WORK" pipetrain "${COMMANDS[@]}" <<'PY'
import re, sys
work, commands = sys.argv[1], sys.argv[2:]
opts = {}      # name -> {command: (letter, text)}
letters = {}   # letter -> {name}
for c in commands:
    lines = open(f"{work}/help.{c}").read().split("\n")
    wide = [l for l in lines if len(l) > 80]
    assert not wide, (c, wide)
    cur = None
    for l in lines:
        m = re.match(r"^  (?:-(\w), )?\s*--([\w-]+)(?: \S+)?(?:\s{2,}(.*))?$", l)
        if m:
            cur = m.group(2)
            opts.setdefault(cur, {})[c] = [m.group(1), m.group(3) or ""]
            if m.group(1):
                letters.setdefault(m.group(1), set()).add(cur)
        elif cur and l.startswith("    ") and l.strip():
            opts[cur][c][1] += " " + l.strip()
        else:
            cur = None
problems = []
for letter, names in letters.items():
    if len(names) > 1:
        problems.append(f"-{letter} means {sorted(names)}")
shared = 0
for name, per in opts.items():
    if len(per) < 2:
        continue
    shared += 1
    # the same letter and text; "(required)" where a command needs the option, else the
    # same default everywhere
    norm = {c: (l, re.sub(r"\s*\((required|default [^()]*)\)$", "", t.strip()))
            for c, (l, t) in per.items()}
    if len(set(norm.values())) > 1:
        problems.append(f"--{name} differs: {norm}")
    defaults = {re.search(r"\((required|default [^()]*)\)$", t.strip()) for l, t in per.values()}
    defaults = {m.group(1) for m in defaults if m} - {"required"}
    if len(defaults) > 1:
        problems.append(f"--{name} has several defaults: {defaults}")
for name in ["model", "stages", "microbatches", "batch", "schedule", "partition", "device",
             "topology", "json", "help"]:
    if name not in opts or len(opts[name]) < 2:
        problems.append(f"--{name} is not shared")
assert opts["partition"]["plan"][1].endswith("(default time)"), opts["partition"]
assert not problems, "\n".join(problems)
print(f"{shared} shared options agree across {len(commands)} commands")
PY
then pass "shared options: one letter, text and default"; else failed "shared options disagree"; fi

# required options and their message
expect_fail "train without --model" "--model FILE is required (see pipetrain train --help)" \
    "$PIPETRAIN" train
expect_fail "plan without --stages" "give --stages K" \
    "$PIPETRAIN" plan --model "$MODELS/seed-mlp.cfg"
expect_fail "a value out of range" "--stages 0: must be between 1 and 4096" \
    "$PIPETRAIN" partition --model "$MODELS/seed-mlp.cfg" --stages 0
expect_fail "a choice" "--optimizer lamb: expected sgd, momentum, adam or adamw" \
    "$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" --optimizer lamb
expect_fail "an ambiguous prefix" "option --m is ambiguous" \
    "$PIPETRAIN" train --m "$MODELS/seed-mlp.cfg"
expect_fail "a missing value" "option --model needs a value" "$PIPETRAIN" summary --model
# short letters work like the long names
if "$PIPETRAIN" partition -m "$MODELS/seed-mlp.cfg" -k 2 -p params >"$WORK/out" &&
   grep -q "into 2 stages by params" "$WORK/out"; then pass "short options"
else failed "partition -m -k -p"; cat "$WORK/out"; fi
# counts of one read as one ("1 stage", not "1 stages")
if "$PIPETRAIN" partition -m "$MODELS/seed-mlp.cfg" -k 1 -p params >"$WORK/out" &&
   grep -q "into 1 stage by params" "$WORK/out"; then pass "one stage, singular"
else failed "partition -k 1"; cat "$WORK/out"; fi
# partition cuts by measured time unless told otherwise, as train does
if "$PIPETRAIN" partition --model "$MODELS/seed-mlp.cfg" --stages 2 >"$WORK/out" &&
   grep -q "by time (measured on this machine)" "$WORK/out"; then pass "partition: time"
else failed "partition's default method"; cat "$WORK/out"; fi

# schedule with reductions: a start and a wait per bucket, the last backward split by bucket
if "$PIPETRAIN" schedule --stages 2 --microbatches 3 --buckets 2 >"$WORK/out" &&
   grep -q '^s0: .* B2/0 A0 B2/1 A1 W0 W1 STEP$' "$WORK/out" &&
   "$PIPETRAIN" schedule --stages 2 --microbatches 3 --buckets 2 --overlap off >"$WORK/out2" &&
   grep -q '^s0: .* B2 A0 A1 W0 W1 STEP$' "$WORK/out2"; then pass "schedule --buckets"
else failed "schedule --buckets"; cat "$WORK/out" "$WORK/out2"; fi
expect_fail "buckets out of range" "--buckets -1: must be between 0 and 64" \
    "$PIPETRAIN" schedule --stages 2 --buckets -1

# version
want=$(sed -n 's/^project(pipetrain.*VERSION \([0-9.]*\).*/\1/p' "$PT_SOURCE_DIR/CMakeLists.txt")
for form in --version version; do
    out=$("$PIPETRAIN" $form)
    if [[ $out =~ ^pipetrain\ ([0-9]+\.[0-9]+\.[0-9]+)(\ \(git\ ([0-9a-f]+)\))?$ ]] &&
       [ "${BASH_REMATCH[1]}" = "$want" ]; then
        commit=${BASH_REMATCH[3]}
        if [ -n "$commit" ] && ! git -C "$PT_SOURCE_DIR" cat-file -e "$commit^{commit}" 2>/dev/null
        then failed "pipetrain $form names commit $commit, which this checkout lacks"
        else pass "pipetrain $form: $out"; fi
    else
        failed "pipetrain $form: '$out' (CMakeLists.txt says $want)"
    fi
done
expect_fail "unknown command" "unknown command" "$PIPETRAIN" frobnicate
finish
