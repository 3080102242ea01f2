#!/usr/bin/env bash
# The directories depend one way: each may include only its own headers and those of the
# layers below it (CMakeLists.txt links one library per directory in the same order):
#   src/base < kernels < src/model < partition < topologies
#   src/base < schedule;  src/base < src/reduce;  src/model < src/io
#   src/io < src/engine < src/cpu;  src/engine < src/cuda (the CUDA plugin)
#   all of the above < src/runtime < src/plan < src/train < src/cli
# Fails naming every include that reaches up (or sideways), so a cycle cannot come back.
# Every directory of project C is covered: one that is not listed here fails the check.
set -euo pipefail
cd "${PT_SOURCE_DIR:-$(dirname "$0")/..}"

base="src/base"
kernels="$base kernels kernels/cuda"
model="$kernels src/model"
partition="$model partition"
topologies="$partition topologies"
engine="$model src/io src/engine"
runtime="$topologies schedule src/reduce src/io src/engine src/cpu src/runtime"
plan="$runtime src/plan"
train="$plan src/train"

allowed_for() {
    case $1 in
        src/base) echo "$base" ;;
        kernels|kernels/cuda) echo "$kernels" ;;
        src/model) echo "$model" ;;
        schedule) echo "$base schedule" ;;
        partition) echo "$partition" ;;
        topologies) echo "$topologies" ;;
        src/reduce) echo "$base src/reduce" ;;
        src/io) echo "$model src/io" ;;
        src/engine) echo "$engine" ;;
        src/cpu) echo "$engine src/cpu" ;;
        src/cuda) echo "$engine src/cuda" ;;
        src/runtime) echo "$runtime" ;;
        src/plan) echo "$plan" ;;
        src/train) echo "$train" ;;
        src/cli) echo "$train src/cli" ;;
        *) echo "" ;;
    esac
}

bad=0 checked=0
while IFS= read -r file; do
    dir=$(dirname "$file")
    allowed=$(allowed_for "$dir")
    if [ -z "$allowed" ]; then
        echo "layering: $file is in $dir, which tests/layering.sh does not place in a layer"
        bad=1
        continue
    fi
    while IFS= read -r inc; do
        checked=$((checked + 1))
        target=$(dirname "$inc")
        ok=0
        for a in $allowed; do [ "$target" = "$a" ] && ok=1; done
        if [ $ok = 0 ]; then
            echo "layering: $file includes \"$inc\": $dir may only use $allowed"
            bad=1
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find src kernels schedule partition topologies \
              -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)

[ $checked -gt 200 ] || { echo "layering: only $checked includes found: wrong directory?"; exit 1; }
[ $bad = 0 ] || exit 1
echo "layering: $checked project includes in $(find src kernels schedule partition topologies -type d | wc -l) directories all point down"
