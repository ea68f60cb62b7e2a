#!/usr/bin/env bash
# A private SLURM cluster on this machine for the SLURM test tier: munged, slurmctld and two slurmd
# (`slurmd -N`: two nodes of this one host, two CPUs each, named after the host and "localhost" so
# that both names resolve: Lightning reaches rank 0 at the first node's name), every file under one
# folder, on the ports the caller gives. Needs root and Debian's slurmctld, slurmd, slurm-client and munge
# (.ci/run installs them); installs nothing itself.
#
#   tests/slurm/cluster.sh start <folder> <slurmctld port> <port of node 1> <port of node 2>
#   tests/slurm/cluster.sh stop <folder>
#
# Clients (sbatch, srun, squeue, scontrol) find it with SLURM_CONF=<folder>/slurm.conf.
set -euo pipefail
command=$1
dir=$(realpath "$2")
export SLURM_CONF=$dir/slurm.conf

start() {
    local host
    host=$(hostname)
    mkdir -p "$dir"/{munge,state,spool,log}
    chmod 700 "$dir" "$dir/munge"
    head -c 1024 /dev/urandom > "$dir/munge/munge.key"
    chmod 400 "$dir/munge/munge.key"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
    cat > "$SLURM_CONF" <<CONF
ClusterName=mnistlab-tests
SlurmctldHost=$host
SlurmctldPort=$3
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmctldDebug=debug2  # logs each time-limit check: the time-limit test times its job by them
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
MinJobAge=600
NodeName=$host NodeHostname=$host Port=$4 CPUs=2 RealMemory=8000 State=UNKNOWN
NodeName=localhost NodeHostname=$host Port=$5 CPUs=2 RealMemory=8000 State=UNKNOWN
PartitionName=tests Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF" -N "$host"
    slurmd -f "$SLURM_CONF" -N localhost
    for _ in $(seq 100); do  # both nodes idle: the cluster takes jobs
        [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = 2 ] && return 0
        sleep 0.2
    done
    echo "the cluster did not come up; logs in $dir/log" >&2
    return 1
}

stop() {
    # A job still running (a test that failed or timed out) is killed first, steps and all: once slurmd is
    # gone, its srun would otherwise wait for ever.
    squeue -h -o %i 2>/dev/null | xargs -r scancel --full --signal=KILL 2>/dev/null || true
    for _ in $(seq 50); do
        [ -z "$(squeue -h 2>/dev/null)" ] && break
        sleep 0.2
    done
    scontrol shutdown 2>/dev/null || true  # slurmctld and every slurmd
    for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munge/munged.pid; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
}

case $command in
start) start "$@" ;;
stop) stop ;;
*) echo "usage: $0 start <folder> <slurmctld port> <node 1 port> <node 2 port> | stop <folder>" >&2; exit 2 ;;
esac
