#!/usr/bin/env bash
# Fresh Debian 12: installs what is missing, builds, and trains the default job:
# seed-cnn on Fashion-MNIST as a 2-stage pipeline on this machine.
set -euo pipefail
cd "$(dirname "$0")"
source cmake/setup.sh
pt_setup_packages
mkdir -p build
pt_build build
echo "== pipetrain: seed-cnn, 2-stage 1F1B pipeline, 8 micro-batches, time-balanced cut"
exec mpiexec -n 2 build/pipetrain train --model models/seed-cnn.cfg --stages 2 \
    --microbatches 8 --schedule 1f1b --partition time --epochs 1 "$@"
