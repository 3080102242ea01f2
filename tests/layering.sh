#!/usr/bin/env bash
# The directories depend one way: each may include only its own headers and those of the
# layers below it (CMakeLists.txt links one library per directory in the same order).
#   src/base < kernels < src/model < partition < topologies < src
#   src/base < schedule < src
# Fails naming every include that reaches up (or sideways), so a cycle cannot come back.
set -euo pipefail
cd "${PT_SOURCE_DIR:-$(dirname "$0")/..}"

allowed_for() {
    case $1 in
        src/base) echo "src/base" ;;
        kernels|kernels/cuda) echo "src/base kernels kernels/cuda" ;;
        src/model) echo "src/base kernels src/model" ;;
        schedule) echo "src/base schedule" ;;
        partition) echo "src/base kernels src/model partition" ;;
        topologies) echo "src/base kernels src/model partition topologies" ;;
        *) echo "*" ;;
    esac
}

bad=0 checked=0
while IFS= read -r file; do
    dir=$(dirname "$file")
    allowed=$(allowed_for "$dir")
    [ "$allowed" = "*" ] && continue
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
done < <(find src/base kernels src/model schedule partition topologies \
              -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)

[ $checked -gt 20 ] || { echo "layering: only $checked includes found: wrong directory?"; exit 1; }
[ $bad = 0 ] || exit 1
echo "layering: $checked project includes in the lower directories all point down"
