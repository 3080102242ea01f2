# The CUDA backend stays a plugin, and asking for it without a GPU fails cleanly:
# - pipetrain and every test binary (but test_cuda_kernels) link no CUDA library;
# - `pipetrain devices` lists the CPU and, without a usable GPU, says why and exits 0
#   (with a GPU and the plugin built: at least one device); its --json parses, also when
#   a message holds a path that needs escaping or is not UTF-8;
# - a bogus PIPETRAIN_CUDA_PLUGIN is named in the message;
# - `train --device cuda` without a GPU (or with the bogus plugin) fails on 1 rank and on
#   every rank of a 2-stage pipeline, within 60 s; `--device bogus` is a usage error.
source "$(dirname "$0")/lib/common.bash"
BUILD=${PT_BUILD_DIR:-$(dirname "$PIPETRAIN")}
PLUGIN=$(dirname "$PIPETRAIN")/libpipetrain-cuda.so
CUDA_LIBS='libcudart|libcublas|libcurand|libcuda\.'
T=(--model "$MODELS/seed-mlp.cfg" --train-samples 256 --test-samples 0 --steps 1 --batch 16
   --threads 1)

# ---- no CUDA library in the CPU binaries ----
no_cuda_libs() {
    local bin=$1 libs
    if ! libs=$(ldd "$bin" 2>&1); then
        failed "ldd $bin: $libs"
    elif grep -qE "$CUDA_LIBS" <<<"$libs"; then
        failed "$bin links CUDA: $(grep -E "$CUDA_LIBS" <<<"$libs" | tr -d '\t' | tr '\n' ' ')"
    else
        return 0
    fi
    return 1
}
no_cuda_libs "$PIPETRAIN" && pass "pipetrain links no CUDA library"
n_bins=0
bad_bins=0
# every ELF executable the build made (tests, experiments), but CMake's probes and the
# one binary that is CUDA by design
while IFS= read -r -d '' bin; do
    [[ $(head -c 4 "$bin" | tr -d '\0') == $'\x7fELF' ]] || continue
    n_bins=$((n_bins + 1))
    no_cuda_libs "$bin" || bad_bins=$((bad_bins + 1))
done < <(find "$BUILD" -path "$BUILD/CMakeFiles" -prune -o -type f -perm -u+x \
    ! -name '*.so' ! -name test_cuda_kernels ! -name pipetrain -print0)
if [ "$n_bins" -lt 3 ]; then
    failed "found only $n_bins binaries under $BUILD (expected the unit tests)"
elif [ "$bad_bins" -eq 0 ]; then
    pass "$n_bins test and experiment binaries link no CUDA library"
fi

# ---- pipetrain devices ----
have_gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    have_gpu=1
fi
NO_GPU_REASON='no CUDA device|built without the CUDA backend|CUDA plugin .* is missing'
rc=0
"$PIPETRAIN" devices >"$WORK/devices.txt" 2>"$WORK/devices.err" || rc=$?
if [ "$rc" -ne 0 ]; then
    failed "pipetrain devices exited $rc: $(cat "$WORK/devices.err")"
elif ! grep -q '^CPU: .*cores' "$WORK/devices.txt"; then
    failed "pipetrain devices does not list the CPU:"; cat "$WORK/devices.txt"
elif [ "$have_gpu" -eq 1 ] && [ -f "$PLUGIN" ]; then
    if grep -q '^  device 0: ' "$WORK/devices.txt"; then
        pass "pipetrain devices lists the GPU: $(grep -m1 '^  device 0' "$WORK/devices.txt")"
    else
        failed "a GPU is present but pipetrain devices lists none:"; cat "$WORK/devices.txt"
    fi
elif grep -qE "^CUDA: not available: .*($NO_GPU_REASON)" "$WORK/devices.txt"; then
    pass "pipetrain devices exits 0 and says why: $(grep -m1 '^CUDA' "$WORK/devices.txt")"
else
    failed "pipetrain devices without a usable GPU gives no reason:"; cat "$WORK/devices.txt"
fi

rc=0
"$PIPETRAIN" devices --json >"$WORK/devices.json" 2>"$WORK/devices.err" || rc=$?
if [ "$rc" -ne 0 ]; then
    failed "pipetrain devices --json exited $rc: $(cat "$WORK/devices.err")"
elif python3 - "$WORK/devices.json" "$have_gpu" "$PLUGIN" <<'EOF'
import json, os, sys
d = json.loads(open(sys.argv[1]).read())
gpu = sys.argv[2] == "1" and os.path.exists(sys.argv[3])
assert d["cpu"]["cores"] >= 1, d["cpu"]
assert isinstance(d["mpi"]["cuda_aware"], bool), d["mpi"]
assert d["blas"]["core"] and d["blas"]["core"] != d["blas"]["core_detected"], d["blas"]
# bf16 products where the CPU has AVX512_BF16, else the reason
flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
assert d["cpu"]["bf16_products"] == ("avx512_bf16" in flags), d["cpu"]
assert (d["cpu"]["bf16_products_why_not"] is None) == d["cpu"]["bf16_products"], d["cpu"]
c = d["cuda"]
if gpu:
    assert c["available"] is True and len(c["devices"]) >= 1, c
    for g in c["devices"]:
        assert g["memory_total_bytes"] > 0 and g["multiprocessors"] > 0, g
        assert g["peak_fp32_flops"] > 0 and g["pci_bus_id"], g
else:
    assert c["available"] is False and c["reason"], c
EOF
then
    pass "pipetrain devices --json parses and agrees ($(head -c 150 "$WORK/devices.json")...)"
else
    failed "pipetrain devices --json:"; cat "$WORK/devices.json"
fi

# A plugin path that is wrong, a file that is no library, a library that is no plugin:
# the listing still works and names the file and what is wrong with it.
echo junk >"$WORK/junk.so"
for bogus in "$WORK/missing.so:No such file" "$WORK/junk.so:junk.so" \
    "$(ldd "$PIPETRAIN" | awk '/libc\.so/ {print $3}'):not a pipetrain CUDA plugin"; do
    file=${bogus%%:*} why=${bogus#*:}
    rc=0
    PIPETRAIN_CUDA_PLUGIN=$file "$PIPETRAIN" devices >"$WORK/out" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        failed "devices with PIPETRAIN_CUDA_PLUGIN=$file exited $rc"; cat "$WORK/out"
    elif grep -F -- "$file" "$WORK/out" | grep -qF -- "$why"; then
        pass "PIPETRAIN_CUDA_PLUGIN=$file: $(grep -m1 '^CUDA' "$WORK/out")"
    else
        failed "PIPETRAIN_CUDA_PLUGIN=$file: no message naming it with '$why':"; cat "$WORK/out"
    fi
done

# The JSON stays valid when a message holds a path with quotes, a backslash, a tab and bytes
# that are not UTF-8 (replaced by U+FFFD): read with json.load(sys.stdin) and as strict
# UTF-8 bytes, the reason names the file.
odd=$WORK/$'odd "plugin"\\\tx\xff\xc3(.so'
rc=0
PIPETRAIN_CUDA_PLUGIN=$odd "$PIPETRAIN" devices --json >"$WORK/odd.json" 2>"$WORK/err" || rc=$?
if [ "$rc" -ne 0 ]; then
    failed "devices --json with an odd plugin path exited $rc: $(cat "$WORK/err")"
elif python3 -c 'import json,sys; json.load(sys.stdin)' <"$WORK/odd.json" &&
    python3 - "$WORK/odd.json" "$odd" <<'EOF'
import json, os, sys
d = json.loads(open(sys.argv[1], "rb").read())  # bytes: strict UTF-8
want = os.fsencode(sys.argv[2]).decode("utf-8", "replace")
assert d["cuda"]["available"] is False and want in d["cuda"]["reason"], d["cuda"]
EOF
then
    pass "devices --json escapes an odd plugin path"
else
    failed "devices --json with an odd plugin path:"; head -c 400 "$WORK/odd.json"; echo
fi

# ---- train --device cuda fails cleanly without a GPU ----
if [ "$have_gpu" -eq 0 ]; then
    expect_fail "train --device cuda without a GPU, 1 rank" \
        "no CUDA device\|built without the CUDA backend\|CUDA plugin .* is missing" \
        "$PIPETRAIN" train "${T[@]}" --device cuda
    expect_fail "train --device cuda without a GPU, 2 ranks" \
        "no CUDA device\|built without the CUDA backend\|CUDA plugin .* is missing" \
        "$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --device cuda --stages 2
fi
expect_fail "train --device cuda with a bogus plugin, 1 rank" "$WORK/missing.so" \
    env PIPETRAIN_CUDA_PLUGIN="$WORK/missing.so" "$PIPETRAIN" train "${T[@]}" --device cuda
expect_fail "train --device cuda with a bogus plugin, 2 ranks" "$WORK/missing.so" \
    "$MPIEXEC" -n 2 env PIPETRAIN_CUDA_PLUGIN="$WORK/missing.so" "$PIPETRAIN" train \
    "${T[@]}" --device cuda --stages 2
rc=0
timeout 60 "$PIPETRAIN" train "${T[@]}" --device bogus >"$WORK/out" 2>"$WORK/err" || rc=$?
if [ "$rc" -eq 2 ] && grep -q -- "--device" "$WORK/err"; then
    pass "--device bogus is a usage error: $(head -1 "$WORK/err")"
else
    failed "--device bogus: exit $rc (expected 2), stderr: $(cat "$WORK/err")"
fi
finish
