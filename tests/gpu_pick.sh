# The GPU each rank takes (cuda_pick_device), with a fake CUDA plugin and a described
# machine of 2 packages × 1 core, each package with 2 NVIDIA GPUs: by local rank when the
# ranks are not bound; the GPUs of a rank's own package when it is bound to that package's
# core; back to local rank when the bus ids are not in the topology; a clear failure on
# every rank when there is no device.
source "$(dirname "$0")/lib/common.bash"
: "${FAKE_GPU_PICK:?set by ctest}"

python3 - "$WORK/two.xml" "$PT_SOURCE_DIR/topologies" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import make_xml as mx
w = mx.Writer("2 packages x 1 core (PU 0 / PU 1), 2 GPUs per package")
mx.machine(w, 2, 2, "two")
def io_for(pkg):
    def io(wr):
        mx.bridge(wr, "host", 0x10 + pkg * 0x40, 0x12 + pkg * 0x40)
        for k in range(2):
            mx.pci_dev(wr, "0000:%02x:00.0" % (0x11 + pkg * 0x40 + k), 0x0302, mx.NVIDIA,
                       0x2330, [("PCIVendor", "NVIDIA Corporation"), ("PCIDevice", "H100")])
        wr.close()
    return io
for pkg in range(2):
    mx.package(w, pkg, ("AuthenticAMD", "Two"), pkg, 1 << 30, [[pkg]], lambda c: [c],
               (1 << 20, 1 << 19, 1 << 15), io_for(pkg))
w.close()
open(sys.argv[1], "w").write(w.text())
PY

# CUDA numbers the GPUs unlike the topology: device 0 and 2 sit on package 1.
GPUS=0000:51:00.0,0000:11:00.0,0000:52:00.0,0000:12:00.0
export HWLOC_XMLFILE=$WORK/two.xml HWLOC_THISSYSTEM=1

pick() { # pick OUT BUSIDS BIND(0|1): two ranks, each bound to PU = its rank when BIND=1
    local out=$1 ids=$2 bind=$3
    local rc=0
    rm -f "$out".[0-9]*
    BUSIDS=$ids RESULT_PREFIX=$out timeout 60 "$MPIEXEC" -n 2 bash -c \
        'if [ '"$bind"' = 1 ]; then exec taskset -c "$PMI_RANK" "$0"; else exec "$0"; fi' \
        "$FAKE_GPU_PICK" >"$out.err" 2>&1 || rc=$?
    cat "$out".[0-9]* >"$out" 2>/dev/null || true
    return $rc
}
device_of() { sed -n "s/^RESULT rank $1 device \([0-9]*\) .*/\1/p" "$2"; }

if pick "$WORK/free" "$GPUS" 0; then
    d0=$(device_of 0 "$WORK/free"); d1=$(device_of 1 "$WORK/free")
    [ "$d0" = 0 ] && [ "$d1" = 1 ] && pass "not bound: devices by local rank (0, 1)" \
        || failed "not bound: devices '$d0' '$d1', expected 0 1"
else
    failed "not bound: the pick failed"; cat "$WORK/free" "$WORK/free.err"
fi

if [ "$(nproc)" -ge 2 ] && pick "$WORK/bound" "$GPUS" 1; then
    d0=$(device_of 0 "$WORK/bound"); d1=$(device_of 1 "$WORK/bound")
    case "$d0" in 1|3) pass "rank 0 on package 0 takes a GPU of package 0 (device $d0)";;
        *) failed "rank 0 on package 0 got device '$d0', expected 1 or 3"; cat "$WORK/bound.err";;
    esac
    case "$d1" in 0|2) pass "rank 1 on package 1 takes a GPU of package 1 (device $d1)";;
        *) failed "rank 1 on package 1 got device '$d1', expected 0 or 2"; cat "$WORK/bound.err";;
    esac
elif [ "$(nproc)" -ge 2 ]; then
    failed "bound: the pick failed"; cat "$WORK/bound" "$WORK/bound.err"
fi

# Bus ids the topology does not show: nothing to place by, so local rank again.
if pick "$WORK/unknown" 0000:99:00.0,0000:9a:00.0 1; then
    d0=$(device_of 0 "$WORK/unknown"); d1=$(device_of 1 "$WORK/unknown")
    [ "$d0" = 0 ] && [ "$d1" = 1 ] && pass "unknown bus ids: devices by local rank" \
        || failed "unknown bus ids: devices '$d0' '$d1', expected 0 1"
else
    failed "unknown bus ids: the pick failed"; cat "$WORK/unknown.err"
fi

# No device: every rank fails with the reason, none hangs.
rc=0
pick "$WORK/none" "" 0 || rc=$?
n=$(grep -c "^RESULT rank [01] failed: .*no CUDA device" "$WORK/none" || true)
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" = 2 ] \
    && pass "no device: both ranks fail with the reason (exit $rc)" \
    || { failed "no device: exit $rc, $n ranks reported"; cat "$WORK/none"; }
finish
