#!/bin/bash
# Shows that tests/cuda/test_transformer_host.cu fails on planted bugs: builds it once per
# TFC_PLANTED case of kernels/cuda/transformer_math.cuh (each breaks one per-thread
# function: layer norm statistics and parameter gradients, GELU forward and backward, the
# position of an embedding row, the token-gradient sum, the attention output and dV, the
# attention dropout's mask (its counter off by one) and its factor left out of dK, the
# vocabulary-parallel loss's sum of exponentials and its tie rule across ranks) and
# requires every build to report a FAIL, then the unplanted build to pass.
#   bash tests/cuda/transformer_plant.sh [BUILD_DIR]   (default build; needs nvcc and the
#   build's libptkernels.a and libptbase.a: cmake --build BUILD --target test_transformer_host)
# About 15 s per case on the 2-core development machine. Not a ctest (nvcc per case).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
nvcc=${NVCC:-nvcc}
command -v "$nvcc" >/dev/null || nvcc=/usr/local/cuda/bin/nvcc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
libs="$build/libptkernels.a $build/libptbase.a -lm $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)"
mpi=$(grep -o "/[^\" ]*libmpich.so" "$build/CMakeFiles/test_transformer_host.dir/linkLibs.rsp" 2>/dev/null)
status=0
for k in 0 1 2 3 4 5 6 7 8 9 10 11 12; do
    if ! "$nvcc" -std=c++17 -O2 -I"$root" $(pkg-config --cflags openblas 2>/dev/null) \
        -DTFC_PLANTED=$k -o "$tmp/t$k" "$root/tests/cuda/test_transformer_host.cu" $libs $mpi \
        2>"$tmp/cc$k"; then
        echo "case $k: build failed"; cat "$tmp/cc$k"; status=1; continue
    fi
    "$tmp/t$k" >"$tmp/out$k"
    rc=$?
    fails=$(grep -c '^FAIL' "$tmp/out$k")
    first=$(grep -m1 '^FAIL' "$tmp/out$k" | awk '{print $2, $3}')
    if [ "$k" = 0 ]; then
        [ $rc = 0 ] && echo "case 0 (no bug): $(tail -1 "$tmp/out$k")" ||
            { echo "case 0 (no bug) FAILED"; status=1; }
    elif [ $rc != 0 ] && [ "$fails" -gt 0 ]; then
        echo "planted $k: caught, $fails checks fail (first: $first)"
    else
        echo "planted $k: NOT caught"; status=1
    fi
done
exit $status
