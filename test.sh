#!/usr/bin/env bash
# Fresh Debian 12: installs what is missing, builds (warnings are errors) and runs the whole
# test suite, then the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer,
# then each input parser under libFuzzer for 20 s (PT_FUZZ_SECONDS).
set -euo pipefail
cd "$(dirname "$0")"
source cmake/setup.sh
pt_setup_packages
mkdir -p build build-asan
echo "== build (Release, -Werror)"
pt_build build -DPT_WERROR=ON
echo "== tests"
(cd build && ctest --output-on-failure --timeout 300)
echo "== sanitizer build (ASan + UBSan): unit tests"
pt_build build-asan -DPT_WERROR=ON -DPT_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L unit --timeout 600)
echo "== fuzzing (libFuzzer, ASan + UBSan): each parser for ${PT_FUZZ_SECONDS:-20} s"
pt_build build-fuzz -DPT_WERROR=ON -DPT_FUZZ=ON -DPT_CUDA=OFF -DPT_TESTS=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo
fuzz/run.sh build-fuzz "${PT_FUZZ_SECONDS:-20}"
