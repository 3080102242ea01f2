#!/usr/bin/env bash
# A language model's text, refused with exit 2 and a message before any training when it
# cannot be used: the wrong kind of model or data, conflicting options, a token file with a
# bad header or a token outside the vocabulary, an empty or non-UTF-8 text file, a corpus
# too short for the context, a checkpoint of another corpus; on every rank of an MPI job.
# `sample`'s bad input likewise. And what works: llm.c and raw token files, a few steps.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
NANO=$MODELS/gpt-nano.cfg
MLP=$MODELS/seed-mlp.cfg
Q=(--steps 2 --batch 4 --threads 1)

python3 - "$WORK" <<'PY'
import os, struct, sys
w = sys.argv[1]
toks = [(i * 7919) % 200 for i in range(3000)]
def llmc(name, toks, magic=20240520, version=1):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, len(toks)
    with open(os.path.join(w, name), 'wb') as f:
        f.write(struct.pack('<256i', *h) + struct.pack('<%dH' % len(toks), *toks))
llmc('ok.bin', toks)
llmc('magic.bin', toks, magic=20240801)
llmc('version.bin', toks, version=2)
llmc('vocab.bin', toks[:1234] + [300] + toks[1234:])
open(os.path.join(w, 'raw.bin'), 'wb').write(struct.pack('<%dH' % len(toks), *toks))
open(os.path.join(w, 'empty.txt'), 'wb').close()
open(os.path.join(w, 'latin1.txt'), 'wb').write(b'caf\xe9 au lait\n' * 200)
open(os.path.join(w, 'short.txt'), 'wb').write(b'thirty-three bytes of some text\n')
open(os.path.join(w, 'ok.txt'), 'wb').write('naïve café, ünïcödé text\n'.encode() * 100)
PY

# expect2 NAME PATTERN CMD...: exit 2 within 60 s, PATTERN on stderr
expect2() {
    local name=$1 pattern=$2 rc=0
    shift 2
    timeout 60 "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 2 ] && grep -q -- "$pattern" "$WORK/err"; then
        pass "$name: exit 2, $(grep -m1 -- "$pattern" "$WORK/err")"
    else
        failed "$name: exit $rc, stderr: $(head -c 400 "$WORK/err")"
    fi
}

# the kind of model against the kind of data
expect2 "image model + --data text" "seed-mlp.cfg is an image model" \
    "$PIPETRAIN" train --model "$MLP" --data text "${Q[@]}"
expect2 "image model + --text" "give this model images" \
    "$PIPETRAIN" train --model "$MLP" --text "$WORK/ok.txt" "${Q[@]}"
expect2 "language model + images" "gpt-nano.cfg is a language model: give it text" \
    "$PIPETRAIN" train --model "$NANO" --train-samples 64 --test-samples 0 "${Q[@]}"
# a language model given no data reads the built-in corpus, as --data text
# (and takes the corpus's own options: --eval-windows, --val-fraction)
rc=0
"$PIPETRAIN" train --model "$NANO" --eval-windows 3 --val-fraction 0.2 "${Q[@]}" \
    >"$WORK/out" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] && grep -q "^data: fortunes" "$WORK/out"; then
    pass "language model without data options: the built-in corpus, with --eval-windows"
else
    failed "language model without data options: exit $rc: $(head -c 300 "$WORK/out")"
fi
# options that cannot go together
expect2 "--text and --data" "both name the data" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/ok.txt" --data /tmp "${Q[@]}"
expect2 "--text and --tokens" "give one corpus" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/ok.txt" --tokens "$WORK/ok.bin" "${Q[@]}"
expect2 "--val with text" "\-\-val is for image data sets" \
    "$PIPETRAIN" train --model "$NANO" --data text --val 10 "${Q[@]}"
expect2 "--val-fraction with images" "\-\-val-fraction is for a text corpus" \
    "$PIPETRAIN" train --model "$MLP" --val-fraction 0.2 "${Q[@]}"
expect2 "--eval-windows with image data options" "\-\-eval-windows is for a text corpus" \
    "$PIPETRAIN" train --model "$MLP" --eval-windows 2 --train-samples 64 "${Q[@]}"
# token files
expect2 "token file: LLaMA-3 magic" "magic.bin: bad magic 20240801.*LLaMA-3" \
    "$PIPETRAIN" train --model "$NANO" --tokens "$WORK/magic.bin" "${Q[@]}"
expect2 "token file: version 2" "version.bin: version 2 not supported" \
    "$PIPETRAIN" train --model "$NANO" --tokens "$WORK/version.bin" "${Q[@]}"
expect2 "raw file given as llm.c's" "raw.bin: bad magic.*--tokens-raw" \
    "$PIPETRAIN" train --model "$NANO" --tokens "$WORK/raw.bin" "${Q[@]}"
expect2 "token outside the vocabulary" \
    "vocab.bin: token 300 at index 1234 is not below the vocabulary size 256 of .*gpt-nano.cfg" \
    "$PIPETRAIN" train --model "$NANO" --tokens "$WORK/vocab.bin" "${Q[@]}"
# text files
expect2 "empty text file" "empty.txt: empty file" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/empty.txt" "${Q[@]}"
expect2 "non-UTF-8 text file" "latin1.txt: not valid UTF-8 at byte offset 3 (byte 0xE9)" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/latin1.txt" "${Q[@]}"
expect2 "missing text file" "missing.txt: cannot open" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/missing.txt" "${Q[@]}"
expect2 "corpus no longer than the context + 1" "short.txt: 32 tokens, no longer than the model's context 32" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/short.txt" --val-fraction 0 "${Q[@]}"
expect2 "validation part shorter than a window" "give a larger --val-fraction" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/ok.txt" --val-fraction 0.01 "${Q[@]}"

# every rank of an MPI job exits 2
rm -f "$WORK"/rc.*
rc=0
# shellcheck disable=SC2016 # expanded by the inner shell, per rank
timeout 120 "$MPIEXEC" -n 2 bash -c '"$0" "$@"; r=$?; echo $r >"'"$WORK"'/rc.${PMI_RANK:-x}"; exit $r' \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/latin1.txt" --stages 2 "${Q[@]}" \
    >"$WORK/out" 2>"$WORK/err" || rc=$?
got=$(cat "$WORK"/rc.* 2>/dev/null | sort | tr '\n' ' ')
if [ "$rc" -eq 2 ] && [ "$got" = "2 2 " ] && grep -q "not valid UTF-8" "$WORK/err"; then
    pass "mpiexec -n 2 --stages 2 on a non-UTF-8 file: each rank exit 2"
else
    failed "mpiexec -n 2 on a non-UTF-8 file: mpiexec $rc, ranks '$got': $(head -c 300 "$WORK/err")"
fi

# what works: each source trains a few steps and reports per token
for src in "--tokens $WORK/ok.bin:perplexity" "--tokens-raw $WORK/raw.bin:perplexity" \
           "--text $WORK/ok.txt:bits per byte" "--data text:bits per byte"; do
    args=${src%%:*} measure=${src#*:}
    read -r -a words <<<"$args"
    rc=0
    timeout 60 "$PIPETRAIN" train --model "$NANO" "${words[@]}" "${Q[@]}" >"$WORK/out" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ] && grep -q "val loss [0-9.]* ($measure [0-9.]*) next-token acc" "$WORK/out"; then
        pass "train ${words[0]}: $(grep -o "val loss.*next-token acc [0-9.]*" "$WORK/out")"
    else
        failed "train ${words[0]}: exit $rc: $(tail -n 3 "$WORK/out")"
    fi
done

# checkpoints keep the corpus: another corpus or split is refused on resume
"$PIPETRAIN" train --model "$NANO" --text "$WORK/ok.txt" "${Q[@]}" --checkpoint-dir "$WORK/ck" \
    >/dev/null
expect2 "resume on another corpus" "was written for another corpus" \
    "$PIPETRAIN" train --model "$NANO" --data text "${Q[@]}" --steps 4 --resume "$WORK/ck"
expect2 "resume with another --val-fraction" "written with --val-fraction 0.1, this run has 0.2" \
    "$PIPETRAIN" train --model "$NANO" --text "$WORK/ok.txt" --val-fraction 0.2 "${Q[@]}" \
    --steps 4 --resume "$WORK/ck"

# sample: bad input is exit 2 with a message
CK=$(ls "$WORK"/ck/ckpt-*.safetensors)
"$PIPETRAIN" train --model "$MLP" --train-samples 64 --test-samples 0 "${Q[@]}" \
    --save "$WORK/mlp.st" >/dev/null
expect2 "sample: missing checkpoint" "nothing.st" \
    "$PIPETRAIN" sample --model "$NANO" --load "$WORK/nothing.st"
expect2 "sample: an image model" "seed-mlp.cfg is not a language model" \
    "$PIPETRAIN" sample --model "$MLP" --load "$WORK/mlp.st"
expect2 "sample: another model's checkpoint" "mlp.st: no tensor layers.0.wte.weight" \
    "$PIPETRAIN" sample --model "$NANO" --load "$WORK/mlp.st"
expect2 "sample: a non-UTF-8 prompt" "\-\-prompt: not valid UTF-8 at byte offset 1" \
    "$PIPETRAIN" sample --model "$NANO" --load "$CK" --prompt $'a\xff'
expect2 "sample: no --load" "\-\-load FILE|DIR is required" "$PIPETRAIN" sample --model "$NANO"
# --data DIR given as its default's directory is still --data DIR: refused for a language
# model like any other directory (it was taken for no option: the fortunes, silently)
expect2 "--data (the default directory) with a language model" "is a language model: give it text" \
    "$PIPETRAIN" train --model "$NANO" --data /usr/share/datasets/fashion-mnist "${Q[@]}"
mkdir "$WORK/nockpt"
expect2 "sample: a directory without checkpoints (names --load, not --resume)" \
    "^pipetrain: \-\-load .*nockpt: no checkpoint in this directory" \
    "$PIPETRAIN" sample --model "$NANO" --load "$WORK/nockpt"
finish
