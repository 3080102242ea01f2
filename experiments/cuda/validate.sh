#!/usr/bin/env bash
# GPU validation of the CUDA backend in one call, on a machine with an NVIDIA GPU:
#
#   bash experiments/cuda/validate.sh          (from anywhere; works in the repository root)
#
# 1. prints the machine (nvidia-smi, nvcc, cmake, gcc);
# 2. builds with -DPT_CUDA=ON in build-cuda/ (the project's own CMake build). If that
#    configure fails because the CPU-side dependencies (MPI, hwloc, OpenBLAS, inih, zlib,
#    Criterion) are not installed, as on a GPU image that has only the CUDA toolkit, it
#    builds test_cuda_kernels alone from its sources (kernels/*.c, src/error.c,
#    kernels/cuda/*.cu, tests/cuda/) with nvcc and gcc, against OpenBLAS if present, else
#    against a plain triple-loop sgemm written below (the CPU reference then computes its
#    products in double: a stricter reference, same tolerance);
# 3. runs test_cuda_kernels (every kernel against the CPU kernels; a per-kernel table);
# 4. runs it again under compute-sanitizer memcheck, when that tool is there.
# Exits non-zero if a step fails; "no GPU" (the test's exit 77) is a failure here.
# Warnings are not errors here (CI checks them); a newer host compiler must not stop the
# validation. Logs go to $OUT (set by the device tool) or build-cuda/. Takes 1–4 minutes.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BUILD=$ROOT/build-cuda
LOGS=${OUT:-$BUILD}
mkdir -p "$BUILD" "$LOGS"
JOBS=$(nproc 2>/dev/null || echo 4)
status=0

section() { printf '\n==== %s\n' "$*"; }

section "machine"
nvidia-smi || echo "nvidia-smi failed (no GPU or no driver?)"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -2
cmake --version | head -1
gcc --version | head -1

# ---------------------------------------------------------------- build
TEST_BIN=""
section "configure + build (cmake -DPT_CUDA=ON, build-cuda)"
if cmake -S "$ROOT" -B "$BUILD" -DPT_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        >"$LOGS/configure.log" 2>&1; then
    grep -E '^-- +\[' "$LOGS/configure.log"
    start=$(date +%s)
    if cmake --build "$BUILD" -j "$JOBS" --target ptcuda test_cuda_kernels \
            >"$LOGS/build.log" 2>&1; then
        echo "built ptcuda and test_cuda_kernels in $(( $(date +%s) - start )) s"
        TEST_BIN=$BUILD/test_cuda_kernels
    else
        tail -40 "$LOGS/build.log"
        echo "FAIL: CMake build (log: $LOGS/build.log)"
        exit 1
    fi
else
    grep -E '^-- +\[|Error|required' "$LOGS/configure.log" | head -20
    echo "CMake configure failed (log: $LOGS/configure.log): building the test directly"
    D=$BUILD/direct
    mkdir -p "$D/obj" "$D/shim"
    CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    BLAS_CFLAGS="" BLAS_LIBS=""
    if pkg-config --exists openblas 2>/dev/null; then
        BLAS_CFLAGS=$(pkg-config --cflags openblas) BLAS_LIBS=$(pkg-config --libs openblas)
        echo "CPU reference BLAS: OpenBLAS $(pkg-config --modversion openblas)"
    else
        echo "CPU reference BLAS: naive sgemm (no OpenBLAS found)"
        cat >"$D/shim/cblas.h" <<'EOF'
/* The subset of CBLAS the CPU kernels use, for validate.sh's direct build. */
#ifndef PT_VALIDATE_CBLAS_H
#define PT_VALIDATE_CBLAS_H
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                 int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                 int ldb, float beta, float *c, int ldc);
#endif
EOF
        cat >"$D/shim/cblas_naive.c" <<'EOF'
#include "cblas.h"
#include <stddef.h>
/* C = alpha·op(A)·op(B) + beta·C, sums in double; beta = 0 never reads C (BLAS rule). */
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                 int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                 int ldb, float beta, float *c, int ldc)
{
    if (order == CblasColMajor) { /* Cᵀ = op(B)ᵀ·op(A)ᵀ in row-major terms */
        cblas_sgemm(CblasRowMajor, tb, ta, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
        return;
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) {
                const size_t ia = ta == CblasNoTrans ? (size_t)i * lda + p : (size_t)p * lda + i;
                const size_t ib = tb == CblasNoTrans ? (size_t)p * ldb + j : (size_t)j * ldb + p;
                const float x = a[ia], y = b[ib];
                s += (double)x * y;
            }
            float *out = &c[(size_t)i * ldc + j];
            *out = beta == 0.0f ? (float)(alpha * s) : (float)(alpha * s + (double)beta * *out);
        }
}
EOF
        BLAS_CFLAGS="-I$D/shim"
        gcc -std=c11 -O2 -c "$D/shim/cblas_naive.c" -o "$D/obj/cblas_naive.o" || exit 1
    fi
    CFLAGS="-std=c11 -D_GNU_SOURCE -O3 -march=native -Wall -Wextra -Wno-unused-parameter"
    CFLAGS="$CFLAGS -I$ROOT -I$CUDA_ROOT/include $BLAS_CFLAGS"
    NVFLAGS="-std=c++17 -O3 -I$ROOT -lineinfo -Xcompiler=-Wall"
    NVFLAGS="$NVFLAGS -gencode=arch=compute_80,code=sm_80"
    NVFLAGS="$NVFLAGS -gencode=arch=compute_90,code=[sm_90,compute_90]"
    start=$(date +%s)
    ok=1
    for f in "$ROOT"/kernels/cuda/*.cu; do
        nvcc $NVFLAGS -c "$f" -o "$D/obj/cuda_$(basename "$f" .cu).o" &
    done
    for f in "$ROOT"/kernels/*.c "$ROOT"/src/error.c "$ROOT"/tests/cuda/test_cuda_kernels.c; do
        gcc $CFLAGS -c "$f" -o "$D/obj/c_$(basename "$(dirname "$f")")_$(basename "$f" .c).o" &
    done
    for job in $(jobs -p); do wait "$job" || ok=0; done
    # rpath: the image's loader configuration need not list the toolkit's libraries.
    if [ $ok = 1 ] && nvcc -o "$D/test_cuda_kernels" "$D"/obj/*.o -lcublas $BLAS_LIBS -lm \
            -Xlinker -rpath="$CUDA_ROOT/lib64:$CUDA_ROOT/targets/x86_64-linux/lib"; then
        echo "built test_cuda_kernels directly in $(( $(date +%s) - start )) s"
        TEST_BIN=$D/test_cuda_kernels
    else
        echo "FAIL: direct build"
        exit 1
    fi
fi

# ---------------------------------------------------------------- run
# The full output (a line per check) goes to the log; shown here: the device, any failed
# check, and the per-kernel table with the closing "N passed, N failed" line.
section "test_cuda_kernels"
timeout 120 "$TEST_BIN" >"$LOGS/test_cuda_kernels.log" 2>&1
rc=$?
grep -E "^(device|FATAL|SKIP)" "$LOGS/test_cuda_kernels.log"
grep -E "^FAIL" "$LOGS/test_cuda_kernels.log" | head -40
if grep -q "^kernel  *checks" "$LOGS/test_cuda_kernels.log"; then
    sed -n '/^kernel  *checks/,$p' "$LOGS/test_cuda_kernels.log"
else
    tail -20 "$LOGS/test_cuda_kernels.log"
fi
case $rc in
    0) echo "test_cuda_kernels: PASS" ;;
    77) echo "test_cuda_kernels: FAIL (skipped: no usable GPU on a machine that should have one)"
        status=1 ;;
    124) echo "test_cuda_kernels: FAIL (timed out after 120 s)"; status=1 ;;
    *) echo "test_cuda_kernels: FAIL (exit $rc; log: $LOGS/test_cuda_kernels.log)"; status=1 ;;
esac

section "compute-sanitizer memcheck"
if command -v compute-sanitizer >/dev/null && [ $rc != 77 ]; then
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 "$TEST_BIN" \
        >"$LOGS/memcheck.log" 2>&1
    mrc=$?
    grep -E "ERROR SUMMARY|passed, .* failed|^=========.*(Invalid|Error|error)" \
        "$LOGS/memcheck.log" | head -20
    case $mrc in
        0) echo "memcheck: PASS" ;;
        124) echo "memcheck: not finished in 150 s (inconclusive; not counted as a failure)" ;;
        *) echo "memcheck: FAIL (exit $mrc; log: $LOGS/memcheck.log)"; status=1 ;;
    esac
else
    echo "compute-sanitizer not available: skipped"
fi

section "result"
[ $status = 0 ] && echo "validate.sh: PASS" || echo "validate.sh: FAIL"
exit $status
