# shellcheck shell=bash
# The rounding-envelope protocol of validate.sh's step 3, shared with envelope_selftest.sh
# (the CPU in the GPU's part) and tests/gpu_check_envelope.sh. Sourced; defines functions.
# Why the protocol is what it is: README.md in this directory, "Tolerances of step 3".
#
# One case is a kind (below), a batch size and a seed. From the case's start S the CPU
# (1 thread) trains the reference C, and from two copies of S perturbed by rounding
# (envelope_check.py perturb: every value moved by about one unit in the last place) the
# envelope runs C1 and C2. Each variant — the device's run, a negative control, or for the
# self-test a stand-in — is then checked against C and the envelope (envelope_check.py
# check) and must pass or be refused, as it says.
#
# Kinds:
#   sgd1   one SGD step (lr 0.05) from a start written by 1 CPU step: the gradients
#   adam1  one Adam step (lr 1e-3) resumed from a CPU checkpoint after 3 Adam steps (the
#          optimizer state in it): the Adam update from a state, not Adam's first steps,
#          which move each parameter by ±lr whatever its gradient's size
#   sgd5   5 SGD steps, adam5  5 Adam steps: end to end, with looser limits (ENV_LIMITS)
# Variants (env_case's arguments), "NAME|START|CHANGE|EXPECT|ARGS":
#   START   ref (the case's start) or p3 (a third perturbed copy: the CPU stand-in for
#           another device's rounding)
#   CHANGE  none; lr (lr 0.1% high: 0.05005, 0.001001; adam1 resumes from a copy of the
#           checkpoint whose metadata says so); seed (another seed: other batches and
#           dropout masks from the same start)
#   EXPECT  pass or fail
#   ARGS    more train options, space-separated (--device cuda, --threads 2)
#
# The caller sets PT (pipetrain), PYNP (a python3 with numpy), ENV_TRAIN (an array: the
# train options every run shares: --model, --data, --test-samples 0, ...), ENV_DIR (a work
# directory) and ENV_LOG (every command and its output is appended there), and may set
# ENV_JOBS (runs at once, default 4) and ENV_TIMEOUT (seconds a run may take, default 120).
# Each checked variant appends a line to $ENV_DIR/results.tsv:
#   KIND BATCH SEED NAME EXPECT RC OK RATIO VERDICT      (tab-separated)
# RC is envelope_check.py's exit status (0 within, 1 outside, 2 an input error; 3: a run
# failed), OK 1 when the outcome is the expected one, RATIO the largest statistic/limit.

ENV_CHECK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/envelope_check.py

# env_kind KIND: sets ENV_OPT (optimizer options), ENV_NEG_LR (lr 0.1% high), ENV_STEPS
# (--steps; adam1 counts the 3 steps of its checkpoint) and ENV_LIMITS (the check's
# options; none: envelope_check.py's defaults, set for one step).
env_kind() {
    case $1 in
        sgd1) ENV_OPT=(--optimizer sgd --lr 0.05) ENV_NEG_LR=0.05005 ENV_STEPS=1 ENV_LIMITS=() ;;
        adam1) ENV_OPT=(--optimizer adam --lr 0.001) ENV_NEG_LR=0.001001 ENV_STEPS=4 ENV_LIMITS=() ;;
        # Five steps: rounding alone moved a tensor's update by up to 8e-4 (SGD) and 1.5e-2
        # (Adam) in the bulk, 1.2e-3 and 4.3e-2 by norm (README.md): floors above 10 times
        # that; other batches and masks (CHANGE seed) give 0.28 and 0.63 at least.
        sgd5) ENV_OPT=(--optimizer sgd --lr 0.05) ENV_NEG_LR=0.05005 ENV_STEPS=5
              ENV_LIMITS=(--floor-bulk 1e-2 --floor-norm 3e-2 --floor-norm-size 0) ;;
        adam5) ENV_OPT=(--optimizer adam --lr 0.001) ENV_NEG_LR=0.001001 ENV_STEPS=5
               ENV_LIMITS=(--floor-bulk 1.5e-1 --floor-norm 4e-1 --floor-norm-size 0) ;;
        *) echo "envelope_lib: unknown kind $1" >&2; return 1 ;;
    esac
}

# env_logged LOG CMD...: CMD under the run timeout, its command line and output to LOG.
env_logged() {
    local log=$1
    shift
    { printf '\n$ %s\n' "$*"; timeout -k 5 "${ENV_TIMEOUT:-120}" "$@" 2>&1; } >"$log"
}

# env_parallel: wait until fewer than ENV_JOBS runs are under way.
env_parallel() {
    while [ "$(jobs -rp | wc -l)" -ge "${ENV_JOBS:-4}" ]; do wait -n 2>/dev/null || true; done
}

# env_init SEED: the start of the seed's cases, 1 CPU step at batch 128 from the seed's
# initialisation (once per seed).
env_init() {
    local init=$ENV_DIR/init-s$1.st
    [ -f "$init" ] && return 0
    env_logged "$ENV_DIR/init-s$1.log" "$PT" train "${ENV_TRAIN[@]}" --batch 128 --seed "$1" \
        --threads 1 --steps 1 --save "$init"
    local rc=$?
    cat "$ENV_DIR/init-s$1.log" >>"$ENV_LOG"
    return $rc
}

# env_check DIR JSON NAME EXPECT RUN RUN_START [NAME EXPECT RUN RUN_START]...: the runs
# (each trained from its RUN_START) against the case in DIR, in one envelope_check.py pass
# (figures to DIR/JSON); a line of results.tsv each. Returns 0 when every outcome is the
# expected one.
env_check() {
    local dir=$1 json=$2 also=() args=("${@:3}") i out rc
    for ((i = 0; i < ${#args[@]}; i += 4)); do
        also+=(--also "${args[i]}" "${args[i + 2]}" "${args[i + 3]}")
    done
    out=$("$PYNP" "$ENV_CHECK" check "$dir/S.st" "$dir/C.st" "${also[@]}" \
        --envelope "$dir/P1.st" "$dir/C1.st" --envelope "$dir/P2.st" "$dir/C2.st" \
        "${ENV_LIMITS[@]}" --json "$dir/$json" 2>&1)
    rc=$?
    printf '\n$ envelope_check.py check %s (%s)\n%s\n' "${dir##*/}" "${args[*]}" "$out" >>"$ENV_LOG"
    local all=0 name expect verdict ratio got ok
    for ((i = 0; i < ${#args[@]}; i += 4)); do
        name=${args[i]} expect=${args[i + 1]}
        verdict=$(grep -m1 "^$name: " <<<"$out")
        verdict=${verdict#"$name: "}
        ratio=$(sed -n 's/.*largest value\/limit \([^ ]*\)$/\1/p' <<<"$verdict")
        case $verdict in
            WITHIN*) got=0 ;;
            OUTSIDE*) got=1 ;;
            *) got=2 verdict="envelope_check.py failed (exit $rc): $(tail -1 <<<"$out")" ;;
        esac
        ok=0
        { [ "$expect" = pass ] && [ $got = 0 ]; } || { [ "$expect" = fail ] && [ $got = 1 ]; } && ok=1
        [ $ok = 1 ] || all=1
        env_result "$dir" "$name" "$expect" "$got" "$ok" "${ratio:--}" "$verdict"
    done
    return $all
}

# env_result DIR NAME EXPECT RC OK RATIO VERDICT: a line of results.tsv (DIR names the case).
env_result() {
    local case=${1##*/} kind batch seed
    IFS=- read -r kind batch seed <<<"$case"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "${batch#b}" "${seed#s}" "$2" "$3" \
        "$4" "$5" "$6" "$7" >>"$ENV_DIR/results.tsv"
}

# env_case KIND BATCH SEED VARIANT...: runs the case and checks each variant (above).
# Returns 0 when every variant's outcome is the expected one.
env_case() {
    local kind=$1 batch=$2 seed=$3
    shift 3
    env_kind "$kind" || return 1
    local dir=$ENV_DIR/$kind-b$batch-s$seed
    mkdir -p "$dir" || return 1
    local common=("${ENV_TRAIN[@]}" --batch "$batch" --seed "$seed" --threads 1 "${ENV_OPT[@]}"
                  --steps "$ENV_STEPS")
    local from=--load v name start change expect args
    if ! env_init "$seed"; then
        for v in "$@"; do
            IFS='|' read -r name start change expect args <<<"$v"
            env_result "$dir" "$name" "$expect" 3 0 - "the start run failed: $(tail -1 "$ENV_DIR/init-s$seed.log")"
        done
        return 1
    fi
    if [ "$kind" = adam1 ]; then # the start: a CPU checkpoint after 3 Adam steps
        from=--resume
        rm -rf "$dir/ck"
        env_logged "$dir/ck.log" "$PT" train "${ENV_TRAIN[@]}" --batch "$batch" --seed "$seed" \
            --threads 1 "${ENV_OPT[@]}" --steps 3 --load "$ENV_DIR/init-s$seed.st" \
            --checkpoint-dir "$dir/ck" --checkpoint-every 3
        {
            cat "$dir/ck.log"
            cp "$dir"/ck/ckpt-*3.safetensors "$dir/S.st"
            # the metadata's lr as pipetrain writes it ("%.9g" of the float)
            "$PYNP" "$ENV_CHECK" set-meta "$dir/S.st" "$dir/Sneg.st" "lr=$("$PYNP" -c \
                'import sys, numpy as np; print("%.9g" % np.float32(sys.argv[1]))' "$ENV_NEG_LR")"
        } >>"$ENV_LOG" 2>&1
    else
        cp "$ENV_DIR/init-s$seed.st" "$dir/S.st"
        cp "$dir/S.st" "$dir/Sneg.st"
    fi
    "$PYNP" "$ENV_CHECK" perturb "$dir/S.st" "$dir/P1.st" $((1000 * seed + 10)) \
        "$dir/P2.st" $((1000 * seed + 20)) "$dir/P3.st" $((1000 * seed + 30)) >>"$ENV_LOG" 2>&1
    # the runs, ENV_JOBS at once: C, C1, C2, then every variant
    local names=(C C1 C2) starts=(S P1 P2) extra=("" "" "")
    for v in "$@"; do
        IFS='|' read -r name start change expect args <<<"$v"
        local s=S more=$args
        [ "$start" = p3 ] && s=P3
        case $change in
            lr) more="--lr $ENV_NEG_LR $more"; [ "$kind" = adam1 ] && s=Sneg ;;
            seed) more="--seed $((seed + 100)) $more" ;;
        esac
        names+=("v-$name") starts+=("$s") extra+=("$more")
    done
    local i rcs=()
    rm -f "$dir"/*.rc
    for i in "${!names[@]}"; do
        if [ ! -f "$dir/${starts[$i]}.st" ]; then
            echo "no start ${starts[$i]}.st (log: $ENV_LOG)" >"$dir/${names[$i]}.log"
            echo 1 >"$dir/${names[$i]}.rc"
            continue
        fi
        env_parallel
        # shellcheck disable=SC2086
        { env_logged "$dir/${names[$i]}.log" "$PT" train "${common[@]}" \
            $from "$dir/${starts[$i]}.st" ${extra[$i]} --save "$dir/${names[$i]}.st"
          echo $? >"$dir/${names[$i]}.rc"; } &
    done
    wait
    for i in "${!names[@]}"; do
        rcs+=("$(cat "$dir/${names[$i]}.rc" 2>/dev/null || echo 1)")
        cat "$dir/${names[$i]}.log" >>"$ENV_LOG"
    done
    local all=0 bad_ref="" checks=()
    for i in 0 1 2; do
        [ "${rcs[$i]}" = 0 ] || bad_ref="the CPU run ${names[$i]} failed: $(tail -1 "$dir/${names[$i]}.log")"
    done
    i=3
    for v in "$@"; do
        IFS='|' read -r name start change expect args <<<"$v"
        if [ -n "$bad_ref" ]; then
            env_result "$dir" "$name" "$expect" 3 0 - "$bad_ref"; all=1
        elif [ "${rcs[$i]}" != 0 ]; then
            env_result "$dir" "$name" "$expect" 3 0 - "the run failed: $(tail -1 "$dir/v-$name.log")"
            all=1
        else
            local rs=S
            [ "$start" = p3 ] && rs=P3
            [ "$change" = lr ] && [ "$kind" = adam1 ] && rs=Sneg
            checks+=("$name" "$expect" "$dir/v-$name.st" "$dir/$rs.st")
        fi
        i=$((i + 1))
    done
    if [ ${#checks[@]} -gt 0 ]; then env_check "$dir" check.json "${checks[@]}" || all=1; fi
    return $all
}

# env_summary NAME [KIND...]: one line on the results of variant NAME (of those kinds):
# how many cases came out as expected, at which batches and seeds, and the case nearest the
# other outcome (largest value/limit for a variant that must pass, smallest for one that
# must fail) with its verdict; the first case that came out wrong instead, if any. Exit 0
# when every case came out as expected.
env_summary() {
    local name=$1
    shift
    awk -F'\t' -v name="$name" -v kinds=" $* " '
        $4 == name && (kinds == "  " || index(kinds, " " $1 " ")) {
            n++; ok += $7; expect = $5
            if (!($2 in b)) { b[$2] = 1; bs = bs (bs ? "," : "") $2 }
            if (!($3 in s)) { s[$3] = 1; ss = ss (ss ? "," : "") $3 }
            r = ($8 == "-") ? (expect == "pass" ? 1e99 : -1) : $8 + 0
            if ($7 == 0 && !bad) bad = $1 " b" $2 " s" $3 ": " $9
            if (n == 1 || (expect == "pass" ? r > wr : r < wr)) {
                wr = r; wc = $1 " b" $2 " s" $3; wv = $9
            }
        }
        END {
            if (!n) { print "no case run"; exit 1 }
            printf "%d of %d cases %s (batch %s; seed %s); ", ok, n,
                expect == "pass" ? "within" : "refused", bs, ss
            if (ok < n) printf "first wrong: %s\n", bad
            else printf "%s %s at %s of its limit: %s\n",
                expect == "pass" ? "nearest the limit:" : "nearest to passing:", wc,
                (wr == 1e99 || wr == -1) ? "?" : wr, wv
            exit ok < n
        }' "$ENV_DIR/results.tsv"
}
