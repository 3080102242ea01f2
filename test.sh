#!/usr/bin/env bash
# Fresh Debian 12: installs what is missing, builds (warnings are errors) and runs the whole
# test suite, then the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
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
