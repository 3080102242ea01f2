#!/usr/bin/env bash
# local-cluster.sh start DIR [NODES] | stop DIR: a real Slurm cluster of NODES (default 2)
# fake nodes on this machine, without systemd, for trying the job scripts and for the
# tests: munged (unless one runs), slurmctld and one slurmd per node (slurmd -N nI), with a
# minimal slurm.conf, state, spool, logs and PID files all in DIR; each node has
# PT_SLURM_CPUS CPUs (default 1; they are the same real cores). Needs root and Debian's
# slurmctld, slurmd, slurm-client and munge. `start` prints the SLURM_CONF to export.
set -euo pipefail
cmd=${1:-} dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start DIR [NODES] | stop DIR" >&2; exit 2; }
CTLD_PORT=${PT_SLURM_PORT:-17000}

stop() {
    for f in "$dir"/pids/*; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        kill "$pid" 2>/dev/null || true
    done
    # give them a moment, then make sure
    for _ in $(seq 20); do
        alive=0
        for f in "$dir"/pids/*; do
            [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1
        done
        [ $alive -eq 0 ] && break
        sleep 0.1
    done
    for f in "$dir"/pids/*; do
        [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
        rm -f "$f"
    done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start DIR [NODES] | stop DIR" >&2; exit 2; }
nodes=${3:-2}
[ "$(id -u)" -eq 0 ] || { echo "local-cluster.sh: needs root (slurmd runs jobs as their user)" >&2; exit 3; }
for b in slurmctld slurmd sbatch sinfo munged; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || {
        echo "local-cluster.sh: $b is missing: apt-get install slurmctld slurmd slurm-client munge" >&2
        exit 3
    }
done
mkdir -p "$dir"/{state,spool,log,pids}
host=$(hostname)
names=()
{
    echo "ClusterName=pipetrain"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "MpiDefault=pmi2"
    echo "ReturnToService=2"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd.%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd.%n.log"
    for i in $(seq "$nodes"); do
        echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((CTLD_PORT + i)) CPUs=${PT_SLURM_CPUS:-1}"
        names+=("n$i")
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$dir/slurm.conf"
export SLURM_CONF=$dir/slurm.conf

# munged: Slurm's authentication; one already answering here (the machine's) serves us too
if ! { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    [ -f /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null;
                                     chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    cp /run/munge/munged.pid "$dir/pids/munged"
fi
/usr/sbin/slurmctld -D -f "$dir/slurm.conf" >"$dir/log/slurmctld.out" 2>&1 &
echo $! >"$dir/pids/slurmctld"
for n in "${names[@]}"; do
    mkdir -p "$dir/spool/$n"
    /usr/sbin/slurmd -D -N "$n" -f "$dir/slurm.conf" >"$dir/log/slurmd.$n.out" 2>&1 &
    echo $! >"$dir/pids/slurmd.$n"
done
# up when every node is idle
for _ in $(seq 100); do
    idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge "$nodes" ] && { echo "SLURM_CONF=$dir/slurm.conf"; exit 0; }
    sleep 0.2
done
echo "local-cluster.sh: the nodes did not come up within 20 s; logs in $dir/log:" >&2
tail -n 5 "$dir"/log/*.log >&2 || true
stop
exit 1
