#!/usr/bin/env bash
# Builds the CUDA binaries HERE and packs them, with everything a bare GPU machine lacks,
# into .gpu-bundle/bundle.tar.xz for experiments/cuda/validate.sh to unpack there.
#
#   bash experiments/cuda/bundle.sh [--partial] [--no-build] [--no-selftest]
#
# Why: the GPU machine has CUDA 13, nvcc and PyTorch but none of the CPU dependencies
# (MPICH, hwloc, OpenBLAS, inih, zlib dev files, Criterion), and no network. So the
# Release build with -DPT_CUDA=ON happens on this machine (it has /usr/local/cuda), and the
# bundle carries the binaries with every shared library they load except glibc's (the
# target has a newer glibc, which runs binaries built against 2.36) and CUDA's own (the
# target has its CUDA 13 runtime and driver; copying ours would tie the two together).
#
# Contents (pipetrain-gpu/ in the tarball):
#   bin/      pipetrain, libpipetrain-cuda.so (beside the binary: that is where pipetrain
#             looks for its plugin), test_cuda_kernels, mpiexec (MPICH's hydra) and
#             hydra_pmi_proxy
#   lib/      non-glibc, non-CUDA shared libraries under the names the binaries ask for;
#             lib/ucx (UCX's shared-memory module: cma), lib/hwloc (PCI discovery);
#             lib/fallback: libstdc++ and libgcc_s, used only when the target has none
#             new enough (env.sh decides)
#   data/fashion-mnist/  the first PT_BUNDLE_TRAIN (10,000) training and PT_BUNDLE_TEST
#             (2,000) test samples as IDX .gz files
#   models/   seed-cnn.cfg (and seed-mlp.cfg)
#   env.sh    `source` it: PATH, LD_LIBRARY_PATH (the target's CUDA libraries found too),
#             HWLOC_PLUGINS_PATH, PT_BUNDLE_DATA, PT_BUNDLE_MODEL
#   MANIFEST  commit, build options, toolkit version, every file with its origin
#
# Options:
#   --partial      allow a bundle without libpipetrain-cuda.so (a dry run before the plugin
#                  exists; validate.sh then fails the steps that need it)
#   --no-build     reuse build-gpu/ as it is
#   --no-selftest  skip the check below
# Self-test (default): unpacks the bundle and, as root, runs its binaries in a chroot that
# holds nothing but glibc, so a library the bundle forgot shows here and not on the GPU
# machine: pipetrain summary, a 2-step CPU training run, the same as a 2-rank pipeline
# through the bundled mpiexec (must match bit for bit), `pipetrain devices`, a bf16 run
# where this CPU has AVX512_BF16 (oneDNN, bundled like the rest), --device cuda
# failing with a message, and every bundled file's NEEDED libraries (only CUDA's may be
# absent). Without root it runs the same outside a chroot.
#
# Fails (exit 1) with a message on any error, or when the tarball exceeds 60 MiB (the device
# tool carries at most 64 MiB with the working tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${PT_BUNDLE_BUILD_DIR:-$ROOT/build-gpu}
OUTDIR=$ROOT/.gpu-bundle
TARBALL=$OUTDIR/bundle.tar.xz
LIMIT_MIB=60
N_TRAIN=${PT_BUNDLE_TRAIN:-10000}
N_TEST=${PT_BUNDLE_TEST:-2000}
DATA_SRC=${PT_BUNDLE_DATA_SRC:-/usr/share/datasets/fashion-mnist}
PARTIAL=0 BUILD_IT=1 SELFTEST=1
for a in "$@"; do
    case $a in
        --partial) PARTIAL=1 ;;
        --no-build) BUILD_IT=0 ;;
        --no-selftest) SELFTEST=0 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bundle.sh: unknown option $a (see --help)" >&2; exit 2 ;;
    esac
done

die() { echo "bundle.sh: FAIL: $*" >&2; exit 1; }
say() { printf '==== %s\n' "$*"; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3

# ---------------------------------------------------------------- toolkit
NVCC=$(command -v nvcc || true)
[ -n "$NVCC" ] || NVCC=/usr/local/cuda/bin/nvcc
[ -x "$NVCC" ] || die "no nvcc (looked on the PATH and at /usr/local/cuda/bin/nvcc)"
CUDA_VERSION=$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p')
say "CUDA toolkit: $NVCC, version $CUDA_VERSION"
# The GPU machine runs CUDA 13 (its driver 580 is CUDA 13.0's). Binaries from a 13.x
# toolkit load its libcudart.so.13/libcublas.so.13; another major version would not.
case $CUDA_VERSION in
    13.0*) echo "matches the GPU machine's CUDA 13.0" ;;
    13.*) echo "NOTE: CUDA $CUDA_VERSION here; the GPU machine has 13.0 (driver 580): a newer" \
               "13.x toolkit may need a newer driver" ;;
    *) die "CUDA $CUDA_VERSION here, but the GPU machine has CUDA 13: its libcudart.so.13 would" \
           "not satisfy these binaries" ;;
esac

# ---------------------------------------------------------------- build
# PT_TESTS=ON: test_cuda_kernels is defined only with the tests (cmake/cuda.cmake).
# PT_NATIVE=OFF: -march=native here means Zen 5 (AVX-512 and newer); the GPU machine's
# CPU is another, and one instruction it lacks would end the run with SIGILL.
if [ $BUILD_IT = 1 ]; then
    say "configure + build (Release, PT_CUDA=ON, PT_TESTS=ON, PT_NATIVE=OFF) in $BUILD"
    mkdir -p "$BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPT_CUDA=ON -DPT_TESTS=ON \
        -DPT_NATIVE=OFF -DCMAKE_CUDA_COMPILER="$NVCC" >"$BUILD/bundle-configure.log" 2>&1 ||
        { tail -30 "$BUILD/bundle-configure.log"; die "configure failed ($BUILD/bundle-configure.log)"; }
    grep -E '^-- +\[' "$BUILD/bundle-configure.log" || true
    # The plugin's target: PT_BUNDLE_PLUGIN_TARGET, else any target named like
    # pipetrain-cuda / pipetrain_cuda (its file must be libpipetrain-cuda.so).
    targets="pipetrain test_cuda_kernels test_transformer_host"
    plugin_target=${PT_BUNDLE_PLUGIN_TARGET:-$(cmake --build "$BUILD" --target help |
        sed -n 's/^\.\.\. \([A-Za-z0-9_.-]*\).*/\1/p' | grep -Ei '^(lib)?pipetrain[-_]?cuda$' |
        head -1 || true)}
    [ -n "$plugin_target" ] && targets="$targets $plugin_target"
    echo "targets: $targets"
    start=$SECONDS
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j "$(nproc)" --target $targets >"$BUILD/bundle-build.log" 2>&1 ||
        { tail -40 "$BUILD/bundle-build.log"; die "build failed ($BUILD/bundle-build.log)"; }
    echo "built in $((SECONDS - start)) s"
fi
PIPETRAIN=$BUILD/pipetrain
TESTBIN=$BUILD/test_cuda_kernels
[ -x "$PIPETRAIN" ] || die "$PIPETRAIN missing"
[ -x "$TESTBIN" ] || die "$TESTBIN missing (is PT_TESTS on and CUDA found?)"
PLUGIN=$(find "$BUILD" -maxdepth 3 -name libpipetrain-cuda.so -newer "$BUILD/CMakeCache.txt" \
    -print -quit 2>/dev/null || true)
[ -n "$PLUGIN" ] || PLUGIN=$(find "$BUILD" -maxdepth 3 -name libpipetrain-cuda.so -print -quit)
if [ -z "$PLUGIN" ]; then
    [ $PARTIAL = 1 ] || die "no libpipetrain-cuda.so in $BUILD: the CUDA plugin is not built" \
        "(no such CMake target yet?). --partial packs the rest for a dry run."
    echo "WARNING: no libpipetrain-cuda.so: a PARTIAL bundle (--device cuda will fail there)"
fi
# H100 and H200 are sm_90: without its machine code the driver would have to compile PTX
# at start (slow, and only if PTX of an older architecture is there at all).
grep -q 'code=[^ "]*sm_90' "$BUILD/compile_commands.json" ||
    die "the CUDA code is not built for sm_90 (see CMAKE_CUDA_ARCHITECTURES in cmake/cuda.cmake)"
MPIEXEC=$(readlink -f "$(command -v mpiexec)") || die "no mpiexec on the PATH"
PROXY=$(dirname "$MPIEXEC")/hydra_pmi_proxy
[ -x "$PROXY" ] || PROXY=$(command -v hydra_pmi_proxy) || die "no hydra_pmi_proxy beside $MPIEXEC"
grep -q 'PT_NATIVE:BOOL=OFF' "$BUILD/CMakeCache.txt" ||
    die "$BUILD is configured with PT_NATIVE=ON (-march=native); rebuild without --no-build"
HOSTBIN=$BUILD/test_transformer_host
[ -x "$HOSTBIN" ] || HOSTBIN=""
for f in "$PIPETRAIN" "$TESTBIN" ${HOSTBIN:+"$HOSTBIN"} ${PLUGIN:+"$PLUGIN"}; do
    # -march=native here would leave AVX-512 (zmm registers) all over the code; the
    # baseline build has none outside the functions that run only where the CPU was found
    # to have it: round_rows_avx512bf16 (kernels/dense_bf16.c, behind its AVX512_BF16 check)
    n=$(objdump -d --no-show-raw-insn "$f" 2>/dev/null |
        awk '/^[0-9a-f]+ <[^>]*>:$/ { fn = $2 }
             /%zmm/ && fn !~ /^<round_rows_avx512bf16[.>]/ { c++ }
             END { print c + 0 }')
    [ "$n" = 0 ] || die "$f holds $n AVX-512 instructions: the GPU machine's CPU may lack them"
done

# ---------------------------------------------------------------- stage the tree
STAGE=$(mktemp -d /tmp/pt-bundle-stage.XXXXXX)
trap 'rm -rf --one-file-system "$STAGE"' EXIT
B=$STAGE/pipetrain-gpu
mkdir -p "$B/bin" "$B/lib/ucx" "$B/lib/hwloc" "$B/lib/fallback" "$B/data/fashion-mnist" \
    "$B/models"
cp "$PIPETRAIN" "$TESTBIN" "$B/bin/"
# the transformer kernels' host check (validate.sh step 10a), when this build has it
[ -x "$BUILD/test_transformer_host" ] && cp "$BUILD/test_transformer_host" "$B/bin/"
[ -n "$PLUGIN" ] && cp "$PLUGIN" "$B/bin/"
cp "$MPIEXEC" "$B/bin/mpiexec"
cp "$PROXY" "$B/bin/hydra_pmi_proxy"
cp "$ROOT"/models/*.cfg "$B/models/"
: >"$STAGE/origins"

# Modules loaded with dlopen, which ldd does not list: UCX's cma transport (single-copy
# shared memory; ib and rdmacm need InfiniBand libraries the GPU machine has no use for)
# and hwloc's PCI discovery (GPUs appear as PCI devices, docs/DESIGN.md).
extra=()
ucs=$(ldd "$PIPETRAIN" | awk '$1 ~ /^libucs\.so/ {print $3}')
if [ -n "$ucs" ] && [ -e "$(dirname "$(readlink -f "$ucs")")/ucx/libuct_cma.so.0" ]; then
    cp -L "$(dirname "$(readlink -f "$ucs")")/ucx/libuct_cma.so.0" "$B/lib/ucx/"
    extra+=("$B/lib/ucx/libuct_cma.so.0")
fi
hwloc=$(ldd "$PIPETRAIN" | awk '$1 ~ /^libhwloc\.so/ {print $3}')
if [ -n "$hwloc" ] && [ -e "$(dirname "$(readlink -f "$hwloc")")/hwloc/hwloc_pci.so" ]; then
    cp -L "$(dirname "$(readlink -f "$hwloc")")/hwloc/hwloc_pci.so" "$B/lib/hwloc/"
    extra+=("$B/lib/hwloc/hwloc_pci.so")
fi

# Which libraries stay behind: glibc's (the target's own glibc must serve them) and CUDA's.
is_glibc() {
    [[ $1 =~ ^(ld-linux.*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl|libBrokenLocale|libthread_db|libc_malloc_debug|libmemusage|libpcprofile|libnss_[a-z]+)\.so ]]
}
is_cuda() {
    [[ $1 =~ ^lib(cuda|cudart|cublas|cublasLt|curand|cufft|cusparse|cusolver|nvJitLink|nvrtc|nccl|nvidia-.*|cudnn.*)\.so ]] ||
        [[ $2 == /usr/local/cuda* ]]
}
: >"$STAGE/cuda-needed"
say "shared libraries"
for f in "$B"/bin/* "${extra[@]}"; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue            # vdso and the loader itself
        [ "$path" = "not" ] && {
            is_cuda "$name" "" && { echo "$name" >>"$STAGE/cuda-needed"; continue; }
            die "$(basename "$f") needs $name, which is not found here"
        }
        if is_glibc "$name"; then continue; fi
        if is_cuda "$name" "$path"; then echo "$name" >>"$STAGE/cuda-needed"; continue; fi
        dest=$B/lib/$name
        [[ $name =~ ^lib(stdc\+\+|gcc_s)\.so ]] && dest=$B/lib/fallback/$name
        [ -e "$dest" ] && continue
        cp -L "$path" "$dest"
        real=$(readlink -f "$path")
        pkg=$(dpkg -S "$real" 2>/dev/null | head -1 | cut -d: -f1 || true)
        [ -n "$pkg" ] || pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1 || true)
        ver=$( [ -n "$pkg" ] && dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
        echo "${dest#"$B"/} <- $real ${pkg:+($pkg $ver)}" >>"$STAGE/origins"
    done < <(ldd "$f")
done
sort -u "$STAGE/cuda-needed" -o "$STAGE/cuda-needed"
cp "$STAGE/cuda-needed" "$B/cuda-needed.txt"
echo "bundled: $(find "$B/lib" -type f | wc -l) libraries, $(du -sm "$B/lib" | cut -f1) MB"
echo "left to the GPU machine (CUDA): $(tr '\n' ' ' <"$STAGE/cuda-needed")"

# The newest symbol versions the bundle needs from the target's glibc and libstdc++.
max_version() { grep -aohE "$1"'_[0-9]+(\.[0-9]+)+' "${@:2}" | sort -uV | tail -1; }
NEED_GLIBC=$(max_version GLIBC "$B"/bin/* "$B"/lib/*.so* "$B"/lib/ucx/* "$B"/lib/hwloc/*)
NEED_CXX="$(max_version GLIBCXX "$B"/bin/* "$B"/lib/*.so* || true)"
NEED_CXX="$NEED_CXX $(max_version CXXABI "$B"/bin/* "$B"/lib/*.so* || true)"
NEED_CXX=$(echo "$NEED_CXX" | xargs)   # trimmed
echo "needs from the target: $NEED_GLIBC${NEED_CXX:+, $NEED_CXX}"

# ---------------------------------------------------------------- data
say "data: first $N_TRAIN training and $N_TEST test samples of $DATA_SRC"
$PY - "$DATA_SRC" "$B/data/fashion-mnist" "$N_TRAIN" "$N_TEST" <<'EOF' || die "data reduction failed"
# Rewrites the first N items of each IDX file (gzip, mtime 0: the same bytes every time).
import gzip, os, struct, sys
src, dst, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for name, n in (('train-images-idx3-ubyte', n_train), ('train-labels-idx1-ubyte', n_train),
                ('t10k-images-idx3-ubyte', n_test), ('t10k-labels-idx1-ubyte', n_test)):
    path = next((p for p in (f'{src}/{name}.gz', f'{src}/{name}') if os.path.exists(p)), None)
    if path is None:
        sys.exit(f'{src}/{name}(.gz): not found')
    raw = (gzip.open if path.endswith('.gz') else open)(path, 'rb').read()
    magic, = struct.unpack('>I', raw[:4])
    ndim = magic & 0xFF
    dims = list(struct.unpack('>' + 'I' * ndim, raw[4:4 + 4 * ndim]))
    if n > dims[0]:
        sys.exit(f'{path}: {dims[0]} items, fewer than the {n} asked for')
    item = 1
    for d in dims[1:]:
        item *= d
    body = raw[4 + 4 * ndim:4 + 4 * ndim + n * item]
    dims[0] = n
    with open(f'{dst}/{name}.gz', 'wb') as f, \
            gzip.GzipFile(fileobj=f, mode='wb', mtime=0, filename='') as g:
        g.write(struct.pack('>I', magic) + struct.pack('>' + 'I' * ndim, *dims) + body)
    print(f'  {name}.gz: {dims}')
EOF

# ---------------------------------------------------------------- env.sh
cat >"$B/env.sh" <<EOF
# Source this (bash): puts the bundle's binaries and libraries first and finds this
# machine's CUDA libraries. Written by experiments/cuda/bundle.sh.
PT_BUNDLE=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export PT_BUNDLE PT_BUNDLE_DATA=\$PT_BUNDLE/data/fashion-mnist
export PT_BUNDLE_MODEL=\$PT_BUNDLE/models/seed-cnn.cfg
export PATH=\$PT_BUNDLE/bin:\$PATH
export HWLOC_PLUGINS_PATH=\$PT_BUNDLE/lib/hwloc
pt_ld=\$PT_BUNDLE/lib
pt_ldconfig() { { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep -F "\$1 (" | sed 's/.*=> //' | head -1 || true; }
# libstdc++ and libgcc_s: the system's when it has them and they are new enough (a newer
# libstdc++ serves older programs; mixing two in one process does not work), else ours.
pt_sys=\$(pt_ldconfig libstdc++.so.6)
pt_old=\$([ -n "\$pt_sys" ] || echo missing)
for pt_v in $NEED_CXX; do
    [ -n "\$pt_sys" ] && ! grep -qa "\$pt_v" "\$pt_sys" && pt_old="lacks \$pt_v"
done
[ -n "\$pt_old" ] && pt_ld=\$pt_ld:\$PT_BUNDLE/lib/fallback
# CUDA's libraries (cuda-needed.txt): the loader's cache, else the toolkit nvcc belongs
# to, /usr/local/cuda, or PyTorch's nvidia-* wheels.
pt_cuda_dirs=""
if command -v nvcc >/dev/null 2>&1; then
    pt_nv=\$(dirname "\$(dirname "\$(readlink -f "\$(command -v nvcc)")")")
    pt_cuda_dirs="\$pt_nv/lib64 \$pt_nv/targets/x86_64-linux/lib \$pt_nv/lib"
fi
pt_cuda_dirs="\$pt_cuda_dirs /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib"
if command -v python3 >/dev/null 2>&1; then
    pt_cuda_dirs="\$pt_cuda_dirs \$(python3 -c 'import glob, site; print(" ".join(d for s in site.getsitepackages() for d in glob.glob(s + "/nvidia/*/lib")))' 2>/dev/null)"
fi
while read -r pt_lib; do
    [ -n "\$pt_lib" ] || continue
    [ -n "\$(pt_ldconfig "\$pt_lib")" ] && continue
    pt_found=""
    for pt_d in \$pt_cuda_dirs; do
        if [ -e "\$pt_d/\$pt_lib" ]; then pt_found=\$pt_d; break; fi
    done
    if [ -n "\$pt_found" ]; then
        case ":\$pt_ld:" in *":\$pt_found:"*) ;; *) pt_ld=\$pt_ld:\$pt_found ;; esac
    else
        echo "env.sh: WARNING: \$pt_lib (CUDA) not found on this machine" >&2
    fi
done <"\$PT_BUNDLE/cuda-needed.txt"
export LD_LIBRARY_PATH=\$pt_ld\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
unset pt_ld pt_sys pt_old pt_v pt_cuda_dirs pt_nv pt_lib pt_found pt_d
EOF

# ---------------------------------------------------------------- manifest
# A fingerprint of the sources (the same function as in validate.sh), so that a stale
# bundle is noticed on the GPU machine.
source_hash() {
    (cd "$1" && find CMakeLists.txt cmake src kernels partition schedule topologies tests/cuda \
        -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cmake' \
        -o -name CMakeLists.txt \) 2>/dev/null | LC_ALL=C sort | xargs sha256sum |
        sha256sum | cut -c1-16)
}
{
    echo "pipetrain GPU bundle, written $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" \
        "($(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) files modified or untracked)"
    echo "source-hash $(source_hash "$ROOT")"
    echo "build: Release, PT_CUDA=ON, PT_TESTS=ON, PT_NATIVE=OFF, $BUILD"
    echo "CUDA toolkit $CUDA_VERSION ($NVCC); device code" \
        "$(grep -o 'arch=compute_[0-9a-z]*,code=[^ "]*' "$BUILD/compile_commands.json" |
            sort -u | tr '\n' ' ')"
    echo "host: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
    echo "needs from the target: $NEED_GLIBC${NEED_CXX:+, $NEED_CXX (else lib/fallback)}"
    echo "plugin: ${PLUGIN:-MISSING (partial bundle)}"
    echo "mpiexec <- $MPIEXEC ($(dpkg -S "$MPIEXEC" 2>/dev/null | cut -d: -f1))"
    echo "CUDA libraries left to the target: $(tr '\n' ' ' <"$STAGE/cuda-needed")"
    echo "data: $N_TRAIN training, $N_TEST test samples of $DATA_SRC"
    echo "origins:"
    sed 's/^/  /' "$STAGE/origins"
    echo "files (sha256, bytes):"
    (cd "$B" && find . -type f ! -name MANIFEST | sort | while read -r f; do
        printf '  %s %10d %s\n' "$(sha256sum "$f" | cut -c1-16)" "$(stat -c %s "$f")" "${f#./}"
    done)
} >"$B/MANIFEST"

# ---------------------------------------------------------------- pack
say "pack"
mkdir -p "$OUTDIR"
start=$SECONDS
tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - pipetrain-gpu |
    xz -T0 -6 >"$TARBALL.tmp"
mv "$TARBALL.tmp" "$TARBALL"
bytes=$(stat -c %s "$TARBALL")
echo "bundle: $TARBALL, $(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB" \
    "($(du -sm "$B" | cut -f1) MiB unpacked), packed in $((SECONDS - start)) s"
[ "$bytes" -le $((LIMIT_MIB * 1048576)) ] || die "the bundle exceeds $LIMIT_MIB MiB"

# ---------------------------------------------------------------- self-test
[ $SELFTEST = 1 ] || { echo "self-test skipped"; exit 0; }
say "self-test"
T=$(mktemp -d /tmp/pt-bundle-test.XXXXXX)
mounts=()
cleanup() {
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null ||
        umount -l "${mounts[i]}" 2>/dev/null || true; done
    # --one-file-system: never descend into anything still mounted
    rm -rf --one-file-system "$T" "$STAGE"
}
trap cleanup EXIT
CHROOT=$(command -v chroot || true)
if [ "$(id -u)" = 0 ] && [ -n "$CHROOT" ] && [ "${PT_BUNDLE_NO_CHROOT:-0}" != 1 ]; then
    R=$T/root
    mkdir -p "$R"/{lib64,lib/x86_64-linux-gnu,etc,tmp,proc,sys,dev,b}
    chmod 1777 "$R/tmp"
    cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
    for l in libc.so.6 libm.so.6 libmvec.so.1 libpthread.so.0 libdl.so.2 librt.so.1 \
             libresolv.so.2 libutil.so.1 libanl.so.1 libnss_files.so.2 libnss_dns.so.2; do
        [ -e /lib/x86_64-linux-gnu/$l ] && cp -L /lib/x86_64-linux-gnu/$l "$R/lib/x86_64-linux-gnu/"
    done
    cp /etc/hosts /etc/passwd /etc/group "$R/etc/" 2>/dev/null || true
    echo "hosts: files dns" >"$R/etc/nsswitch.conf"
    mount -t proc proc "$R/proc" && mounts+=("$R/proc")
    mount -t sysfs -o ro sysfs "$R/sys" && mounts+=("$R/sys")
    mount -t tmpfs -o size=64m tmpfs "$R/dev" && mounts+=("$R/dev")
    mkdir -p "$R/dev/shm"
    mount -t tmpfs -o size=1g tmpfs "$R/dev/shm" && mounts+=("$R/dev/shm")
    for d in null:1:3 zero:1:5 random:1:8 urandom:1:9; do
        IFS=: read -r n ma mi <<<"$d"
        mknod -m 666 "$R/dev/$n" c "$ma" "$mi"
    done
    xz -dc "$TARBALL" | tar -C "$R/b" --strip-components=1 -xf -
    # no system libstdc++ in the chroot: env.sh would pick lib/fallback; CUDA: absent
    in_box() {
        env -i HOME=/tmp PATH=/b/bin LD_LIBRARY_PATH=/b/lib:/b/lib/fallback \
            HWLOC_PLUGINS_PATH=/b/lib/hwloc "$CHROOT" "$R" "$@"
    }
    P=/b/bin/pipetrain W=/tmp BOX="a chroot holding only glibc"
else
    echo "no chroot (not root, or PT_BUNDLE_NO_CHROOT=1): the self-test runs in the system," \
        "where a library the bundle forgot may still be found"
    mkdir -p "$T/b"
    xz -dc "$TARBALL" | tar -C "$T/b" --strip-components=1 -xf -
    in_box() { env -i HOME="$T" PATH="$T/b/bin:/usr/bin:/bin" \
        bash -c 'source "$0/env.sh" && exec "${@}"' "$T/b" "$@"; }
    P=$T/b/bin/pipetrain W=$T BOX="the system, with env.sh"
    R=""
fi
BD=${P%/bin/pipetrain}
fails=0
check() { # name, command...
    local name=$1; shift
    if out=$(in_box "$@" 2>&1); then
        echo "  ok    $name"
        grep -iE 'warn|error' <<<"$out" | head -3 | sed 's/^/        /' || true
    else
        echo "  FAIL  $name (exit $?)"; echo "$out" | tail -15 | sed 's/^/        /'
        fails=$((fails + 1)); fi
}
echo "in $BOX:"
check "pipetrain summary" $P summary --model $BD/models/seed-cnn.cfg
common="--model $BD/models/seed-cnn.cfg --data $BD/data/fashion-mnist --test-samples 200 \
    --batch 32 --steps 2 --seed 3 --threads 1 --microbatches 2 --timeout 60"
# shellcheck disable=SC2086
check "train, 1 rank, CPU" $P train $common --save $W/one.safetensors
# shellcheck disable=SC2086
check "train, 2 ranks (mpiexec -launcher fork)" $BD/bin/mpiexec -launcher fork -n 2 \
    $P train $common --stages 2 --save $W/two.safetensors
check "2 ranks = 1 rank, bit for bit" $P diff $W/two.safetensors $W/one.safetensors
check "pipetrain devices (no CUDA here: says why, exits 0)" $P devices
# bf16 products through the bundled oneDNN, where this CPU has AVX512_BF16 (kernels/bf16.h)
if grep -qw avx512_bf16 /proc/cpuinfo; then
    # shellcheck disable=SC2086
    check "train --precision bf16, 1 rank, CPU (oneDNN)" $P train $common --precision bf16
fi
# Every library any bundled file names (NEEDED) is in the bundle, glibc's, or CUDA's
# (cuda-needed.txt); the loader stops at the first missing one, so this is checked on the
# names rather than by loading the plugin, whose CUDA libraries are absent here.
missing=""
U=${BD/#\/b/$R/b}
while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        if is_glibc "$n" || [ -e "$U/lib/$n" ] || [ -e "$U/lib/fallback/$n" ] ||
            grep -qxF "$n" "$U/cuda-needed.txt"; then continue; fi
        missing="$missing ${f#"$U"/}:$n"
    done
done < <(find "$U/bin" "$U/lib" -type f -print0)
if [ -z "$missing" ]; then
    echo "  ok    every NEEDED library is bundled, glibc's or CUDA's ($(tr '\n' ' ' <"$U/cuda-needed.txt"))"
else
    echo "  FAIL  NEEDED but not bundled:$missing"; fails=$((fails + 1))
fi
# A CUDA run where CUDA is absent must fail with a message, not crash or pass.
rc=0
# shellcheck disable=SC2086
out=$(in_box $P train $common --device cuda 2>&1) || rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 126 ]; then
    echo "  ok    --device cuda without CUDA fails cleanly (exit $rc): $(echo "$out" | tail -1)"
else
    echo "  FAIL  --device cuda without CUDA: exit $rc"; echo "$out" | tail -5
    fails=$((fails + 1))
fi
# Outside the box, with env.sh: the kernel test must at least start and report no GPU.
rc=0
out=$(env -i HOME="$T" PATH=/usr/bin:/bin bash -c \
    'mkdir -p "$0/x" && xz -dc "$1" | tar -C "$0/x" --strip-components=1 -xf - &&
     source "$0/x/env.sh" && exec test_cuda_kernels' "$T" "$TARBALL" 2>&1) || rc=$?
case $rc in
    0|77) echo "  ok    test_cuda_kernels with env.sh starts (exit $rc: $(echo "$out" |
          grep -E '^(SKIP|device)' | head -1))" ;;
    *) echo "  FAIL  test_cuda_kernels with env.sh: exit $rc"; echo "$out" | tail -5
       fails=$((fails + 1)) ;;
esac
[ $fails = 0 ] || die "self-test: $fails check(s) failed"
echo "self-test passed"
