#!/usr/bin/env bash
# The project's size rules (docs/DESIGN.md, "Size"): no function over 100 lines and no file
# over 800 lines in the project's C. A function is counted from the first line of its
# signature to its closing brace; the code's style puts a definition's braces in column 0
# ("{" on a line of its own, "}" first on its last line), which is what this reads.
# Fails naming every function and file over its limit.
set -euo pipefail
cd "${PT_SOURCE_DIR:-$(dirname "$0")/..}"
max_function=${PT_MAX_FUNCTION_LINES:-100}
max_file=${PT_MAX_FILE_LINES:-800}

files=$(find src kernels schedule partition topologies tests fuzz experiments \
             \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
[ -n "$files" ] || { echo "size_limits: no C found: wrong directory?"; exit 1; }

bad=0 functions=0
while IFS= read -r line; do
    case $line in
        F*) functions=$((functions + 1)) ;;
        L*) echo "size_limits: ${line#L }"; bad=1 ;;
    esac
done < <(awk -v max="$max_function" '
    FNR == 1 { sig = 0; inside = 0 }
    # a signature starts at column 0 with a name and an open parenthesis (not a
    # preprocessor line, a comment, a declaration ending in ";" or a closing brace)
    !inside && /^[A-Za-z_][A-Za-z0-9_ \t\*,]*\(/ && !/;[ \t]*$/ { sig = FNR; name = $0 }
    !inside && /^{/ && sig { inside = 1; start = sig }
    inside && /^}/ {
        n = FNR - start + 1
        print "F"
        if (n > max) {
            sub(/\(.*/, "", name); k = split(name, w, /[ \t\*]+/)
            printf "L %s:%d: %s is %d lines (limit %d)\n", FILENAME, start, w[k], n, max
        }
        inside = 0; sig = 0
    }
' $files)
for f in $files; do
    n=$(wc -l <"$f")
    if [ "$n" -gt "$max_file" ]; then
        echo "size_limits: $f is $n lines (limit $max_file)"
        bad=1
    fi
done
[ "$functions" -gt 1000 ] || { echo "size_limits: only $functions functions found: parser broken?"; exit 1; }
[ $bad = 0 ] || exit 1
echo "size_limits: $functions functions all within $max_function lines, $(echo "$files" | wc -l) files within $max_file"
