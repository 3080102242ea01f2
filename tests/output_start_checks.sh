# --save, --trace, --metrics and --checkpoint-dir are checked at start, by rank 0, before
# any training: a directory, a FIFO, a device, a link to a device, a trailing '/' or an
# empty path makes every rank exit 2 with the reason (issue 23 item 4). --metrics and
# --trace never write through a planted link and keep an existing file's mode.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
RUN=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 256 --test-samples 0 --threads 1
     --steps 2)
cd "$WORK"
mkdir adir
mkfifo fifo
ln -s /dev/null devlink

# refused at start: exit 2 on both ranks, and no step was run
start_refused() {
    local name=$1 pattern=$2
    shift 2
    local rc=0
    timeout 60 "$MPIEXEC" -n 2 "$PIPETRAIN" train "${RUN[@]}" --stages 2 "$@" >out 2>err || rc=$?
    if [ "$rc" -ne 2 ]; then
        failed "$name: exit $rc, not 2"; cat err
    elif ! grep -q -- "$pattern" err; then
        failed "$name: stderr lacks '$pattern'"; cat err
    elif grep -q "step " out; then
        failed "$name: training ran before the refusal"
    else
        pass "$name: $(grep -m1 -- "$pattern" err)"
    fi
}
for opt in --save --trace --metrics; do
    start_refused "$opt a directory" "is a directory" "$opt" adir
    start_refused "$opt a FIFO" "FIFO" "$opt" fifo
    start_refused "$opt a device" "device" "$opt" /dev/null
    start_refused "$opt /dev/stdout" "under /dev" "$opt" /dev/stdout
    start_refused "$opt a link to a device" "link to something other" "$opt" devlink
    start_refused "$opt a trailing /" "ends in '/'" "$opt" adir/
    start_refused "$opt empty" "empty path" "$opt" ""
done
# a directory that takes no new file whatever its permission bits say (root may "write" in
# /proc): the creation itself is tried at start
[ -d /proc ] && start_refused "--save in /proc" "cannot create files in /proc" --save /proc/x.st
start_refused "--checkpoint-dir a FIFO" "not a directory" --checkpoint-dir fifo
start_refused "--checkpoint-dir a file" "not a directory" --checkpoint-dir err
start_refused "--checkpoint-dir empty" "empty path" --checkpoint-dir ""
[ -p fifo ] && pass "the FIFO is still a FIFO" || failed "the FIFO was replaced"
# two outputs in one file, or an output over an input: refused (one overwrote the other, and
# --save over the model file destroyed it at the end)
start_refused "--save and --trace one file" "name the same file" --save same.out --trace ./same.out
cp "$MODELS/seed-mlp.cfg" model.cfg
start_refused "--save over the model file" "is the model file" --model model.cfg --save model.cfg
grep -q '^\[dense\]' model.cfg && pass "the model file is intact" || failed "the model file was written"
# --save at a checkpoint's name in --checkpoint-dir: refused (it replaced that checkpoint with
# a file --resume refuses)
mkdir ck
start_refused "--save as a checkpoint of --checkpoint-dir" "a file of --checkpoint-dir" \
    --checkpoint-dir ck --save ck/ckpt-0000000002.safetensors

# planted links are replaced, never written through; an existing file keeps its mode
echo precious > victim
ln -s victim metrics.jsonl
ln -s victim trace.json
"$PIPETRAIN" train "${RUN[@]}" --metrics metrics.jsonl --trace trace.json >/dev/null
[ "$(cat victim)" = precious ] && pass "the link's target is untouched" \
    || failed "the link's target was written"
[ -f metrics.jsonl ] && [ ! -L metrics.jsonl ] && grep -q '"type":"run"' metrics.jsonl \
    && pass "--metrics replaced the link by its file" || failed "--metrics through a link"
[ -f trace.json ] && [ ! -L trace.json ] && pass "--trace replaced the link by its file" \
    || failed "--trace through a link"
chmod 600 metrics.jsonl trace.json
"$PIPETRAIN" train "${RUN[@]}" --metrics metrics.jsonl --trace trace.json >/dev/null
[ "$(stat -c %a metrics.jsonl) $(stat -c %a trace.json)" = "600 600" ] \
    && pass "both keep mode 0600" || failed "modes became $(stat -c %a metrics.jsonl trace.json)"
grep -q '"type":"final"' metrics.jsonl && pass "the metrics file is whole" \
    || failed "the metrics file lacks its final line"
ls | grep -q tmp && failed "a temporary was left: $(ls)" || pass "no temporary left behind"
finish
