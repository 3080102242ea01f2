# Shared by run.sh and test.sh: install what is missing, then configure and build.
# Sourced, not run: defines pt_setup_packages and pt_build.

PT_PACKAGES=(build-essential cmake pkg-config mpich libmpich-dev hwloc libhwloc-dev
             libopenblas-dev zlib1g-dev libinih-dev libjansson-dev libdnnl-dev libhwloc-plugins libcriterion-dev dataset-fashion-mnist fortunes-min
             python3 python3-matplotlib clang libclang-rt-14-dev
             slurmctld slurmd slurm-client munge)

# MPICH looks up this host's name when a process starts; where the name does not resolve (a
# root made by debootstrap has no /etc/hosts) every lookup waits for DNS to time out, about
# 5 s per rank per start. Debian's installer maps the name to 127.0.1.1; do the same.
pt_setup_hostname() {
    local name
    name=$(hostname 2>/dev/null) || return 0
    [ -n "$name" ] && ! getent hosts "$name" >/dev/null 2>&1 || return 0
    if [ "$(id -u)" -eq 0 ]; then
        echo "== this host's name '$name' does not resolve (MPI would wait ~5 s per process):" \
             "adding '127.0.1.1 $name' to /etc/hosts, as Debian's installer does"
        printf '127.0.1.1\t%s\n' "$name" >>/etc/hosts
    else
        echo "warning: this host's name '$name' does not resolve, so every MPI process waits" \
             "~5 s at start; add it to /etc/hosts:" >&2
        echo "  echo '127.0.1.1 $name' | sudo tee -a /etc/hosts" >&2
    fi
}

pt_setup_packages() {
    pt_setup_hostname
    local missing=()
    for p in "${PT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ]; then
        echo "== installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        echo "missing Debian packages: ${missing[*]}" >&2
        echo "install them with:  sudo apt-get install -y ${missing[*]}" >&2
        return 1
    fi
}

# pt_build DIR [cmake options...] [--target NAME...]: everything, or the targets named
# (test.sh's sanitizer builds need only their tests or fuzzers)
pt_build() {
    local dir=$1
    mkdir -p "$dir"
    shift
    local opts=() targets=()
    while [ $# -gt 0 ]; do
        if [ "$1" = --target ]; then targets+=(--target "$2"); shift 2
        else opts+=("$1"); shift; fi
    done
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "${opts[@]}" >"$dir/pt-configure.log" 2>&1 \
        || { cat "$dir/pt-configure.log"; return 1; }
    grep -E '\[(x| )\]' "$dir/pt-configure.log" || true
    cmake --build "$dir" -j "$(nproc)" "${targets[@]}" -- --no-print-directory \
        >"$dir/pt-build.log" 2>&1 || { tail -n 60 "$dir/pt-build.log"; return 1; }
}
