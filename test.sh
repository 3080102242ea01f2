#!/usr/bin/env bash
# Fresh Debian 12: installs what is missing, builds (warnings are errors) and runs the whole
# test suite, then the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (without a GPU, not the two that nvcc builds), then each input parser under libFuzzer for
# 10 s (PT_FUZZ_SECONDS), as many at once as there are cores. For the inner loop of
# development: (cd build && ctest -L quick -j 3).
set -euo pipefail
cd "$(dirname "$0")"
source cmake/setup.sh
pt_setup_packages
mkdir -p build build-asan
echo "== build (Release, -Werror)"
pt_build build -DPT_WERROR=ON
# Two tests more than cores: the MPI tests oversubscribe and wait politely, and several of
# them mostly wait (restarts, signals, Slurm, time-outs). PT_TEST_JOBS overrides.
jobs=${PT_TEST_JOBS:-$(($(nproc) + 2))}
echo "== tests ($jobs at a time)"
(cd build && ctest --output-on-failure --timeout 300 -j "$jobs")
# The sanitizer builds: -O1 (what ASan's authors advise) with line tables only, enough for
# its reports and a third quicker to build than -O2 -g; only the programs they run.
SAN_FLAGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
# nvcc's code is not instrumented (cmake/cuda.cmake): without a GPU, its two unit tests would
# only rebuild the CUDA kernels (a minute here) to run the host test again and skip the other.
san_target=unit_tests san_skip=()
gpus=$(nvidia-smi -L 2>/dev/null || true)
grep -q '^GPU ' <<<"$gpus" || san_target=unit_tests_c san_skip=(-LE nvcc)
echo "== sanitizer build (ASan + UBSan): unit tests ($san_target)"
pt_build build-asan -DPT_WERROR=ON -DPT_SANITIZE=ON "${SAN_FLAGS[@]}" --target "$san_target"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L unit "${san_skip[@]}" \
    --timeout 600 -j "$(nproc)")
echo "== fuzzing (libFuzzer, ASan + UBSan): each parser for ${PT_FUZZ_SECONDS:-10} s"
pt_build build-fuzz -DPT_WERROR=ON -DPT_FUZZ=ON -DPT_CUDA=OFF -DPT_TESTS=OFF \
    -DCMAKE_C_COMPILER=clang "${SAN_FLAGS[@]}" --target fuzzers
fuzz/run.sh build-fuzz "${PT_FUZZ_SECONDS:-10}"
