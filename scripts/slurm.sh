#!/usr/bin/env bash
# A one-node Slurm on this machine from Debian's packages, for distlab's Slurm tests and notebooks.
#
#   scripts/slurm.sh up      install slurm-wlm and munge when missing (root, apt), write a minimal
#                            slurm.conf under $SLURM_DIR, start munged, slurmctld and slurmd, and
#                            wait until the node is idle
#   scripts/slurm.sh down    stop what `up` started (nothing else) and wait until it is gone
#   scripts/slurm.sh status  sinfo and squeue, or "not running"
#   scripts/slurm.sh two-up  two emulated Slurm nodes beside it: slurmd in two network namespaces
#                            (10.97.0.1, 10.97.0.2 on a bridge, as distlab/bench/emulate.py's hosts),
#                            their own slurmctld and config under $SLURM_DIR/two; Slurm's commands
#                            reach it with SLURM_CONF=$SLURM_DIR/two/slurm.conf (printed)
#   scripts/slurm.sh two-down  stop it, remove the namespaces and the bridge
#
# $SLURM_DIR (default: .slurm/ in the repository) holds the config, state, logs and pid files.
# /etc/slurm/slurm.conf is made a link to it while the Slurm is up, so plain `sbatch`/`squeue`
# (and dask-jobqueue, which calls them) find it without SLURM_CONF; a real file there is a real
# Slurm's config, which this script refuses to touch.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SLURM_DIR:-$ROOT/.slurm}"
ETC_CONF=/etc/slurm/slurm.conf
NODE="$(hostname -s)"

say() { echo "slurm: $*" >&2; }
die() { say "$*"; exit 1; }
# exit 2: Slurm cannot be installed here (not root, no apt-get, apt-get failed): tests skip on it
cannot() { say "$*"; exit 2; }

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null && return 0
    [ "$(id -u)" = 0 ] || cannot "slurm-wlm and munge are not installed and this is not root: install them \
(apt-get install slurm-wlm munge) or run as root"
    command -v apt-get >/dev/null || cannot "slurm-wlm and munge are not installed and there is no apt-get"
    say "installing slurm-wlm and munge (apt-get)"
    # Debian's postinst tries to start the services; in a container policy-rc.d refuses, which is fine:
    # this script starts them itself
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge; } >"${TMPDIR:-/tmp}/distlab-slurm-apt.log" 2>&1 \
        || cannot "apt-get install slurm-wlm munge failed (log: ${TMPDIR:-/tmp}/distlab-slurm-apt.log)"
}

free_port() {
    # a port nobody listens on now: Slurm's defaults (6817/6818) may be taken by another Slurm
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_conf() {
    local cpus mem
    # the node as slurmd sees this machine: all its CPUs, its memory less a margin for the daemons
    read -r cpus mem < <(slurmd -C | awk '{for (i = 1; i <= NF; i++) {split($i, kv, "=");
        if (kv[1] == "CPUs") c = kv[2]; if (kv[1] == "RealMemory") m = kv[2]}} END {print c, m}')
    mem=$(( mem * 9 / 10 ))
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/slurm.sh up: a one-node Slurm for distlab's tests.
ClusterName=distlab
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
AuthType=auth/munge
# no cgroups: this machine may not offer them; linuxproc tracks a job's processes by parent pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
# CPUs are what a job holds (one-core workers share the node); memory is checked, not reserved
SelectTypeParameters=CR_CPU
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ReturnToService=2
# a cancelled job's worker gets SIGTERM, then SIGKILL this many seconds later (default 30)
KillWait=5
MinJobAge=60
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

link_conf() {
    mkdir -p "$(dirname "$ETC_CONF")"
    if [ -e "$ETC_CONF" ] && [ ! -L "$ETC_CONF" ]; then
        die "$ETC_CONF is a real Slurm's config: this machine has its own Slurm; use it (no slurm-up needed)"
    fi
    ln -sfn "$DIR/slurm.conf" "$ETC_CONF"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a munged already answers (the machine's own): use it, and leave it running
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    [ -s /etc/munge/munge.key ] || { mungekey --create >/dev/null 2>&1 || create-munge-key -f; }
    runuser -u munge -- munged
    cp /run/munge/munged.pid "$DIR/munged.pid"  # ours to stop
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "munged started but does not answer (munge -n | unmunge)"
}

node_state() { sinfo -h -n "$NODE" -o %t 2>/dev/null | head -1; }

up() {
    install_packages
    [ "$(id -u)" = 0 ] || cannot "starting munged, slurmctld and slurmd needs root"
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && [ "$(node_state)" = idle ]; then
        say "already up ($DIR)"
        return 0
    fi
    down quiet
    write_conf
    link_conf
    start_munge
    slurmctld -c  # -c: no jobs left from an earlier start
    slurmd
    for _ in $(seq 100); do
        case "$(node_state)" in
            idle | mix | alloc) say "up: node $NODE, $(sinfo -h -o '%c CPUs, partition %P')"; return 0 ;;
            down* | drain*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
        esac
        sleep 0.2
    done
    tail -5 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
    die "the node did not become idle within 20 s (logs above; $DIR/log)"
}

stop_pidfile() {
    local file="$1" pid
    alive "$file" || { rm -f "$file"; return 0; }
    pid="$(cat "$file")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$file"
}

down() {
    # jobs first: their processes are children of slurmstepd, which slurmd's stop would leave behind
    if alive "$DIR/slurmctld.pid"; then
        scancel --full --quiet --user=root 2>/dev/null || true
        scancel --full --quiet --state=PENDING 2>/dev/null || true
        for _ in $(seq 50); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    stop_pidfile "$DIR/slurmd.pid"
    stop_pidfile "$DIR/slurmctld.pid"
    stop_pidfile "$DIR/munged.pid"
    if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$DIR/slurm.conf" ]; then
        rm -f "$ETC_CONF"
    fi
    [ "${1:-}" = quiet ] || say "down"
}

status() {
    if alive "$DIR/slurmctld.pid"; then
        sinfo
        squeue
    else
        echo "not running ($DIR)"
    fi
}

# -- two emulated nodes ------------------------------------------------------------------------------
TWO="$DIR/two"
NET=10.97.0
BRIDGE=dlslurmbr

two_conf() {
    mkdir -p "$TWO/state" "$TWO/log" "$TWO/spool-emu0" "$TWO/spool-emu1"
    cat >"$TWO/slurm.conf" <<EOF
# Written by scripts/slurm.sh two-up: two emulated Slurm nodes (network namespaces) for distlab's tests.
ClusterName=distlab2
SlurmctldHost=$NODE($NET.254)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=$TWO/state
# %n: each slurmd its own spool, pid file and log (both run on this machine)
SlurmdSpoolDir=$TWO/spool-%n
SlurmctldPidFile=$TWO/slurmctld.pid
SlurmdPidFile=$TWO/slurmd-%n.pid
SlurmctldLogFile=$TWO/log/slurmctld.log
SlurmdLogFile=$TWO/log/slurmd-%n.log
ReturnToService=2
KillWait=5
MinJobAge=60
# one CPU each: the two nodes share this machine's cores
NodeName=emu0 NodeAddr=$NET.1 NodeHostname=$NODE CPUs=1 RealMemory=4000 State=UNKNOWN
NodeName=emu1 NodeAddr=$NET.2 NodeHostname=$NODE CPUs=1 RealMemory=4000 State=UNKNOWN
PartitionName=two Nodes=emu0,emu1 Default=YES MaxTime=INFINITE State=UP
EOF
}

two_net() {
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for i in 0 1; do
        ip netns add "dlslurm$i"
        ip link add "dlsi$i" type veth peer name "dlso$i"
        ip link set "dlsi$i" netns "dlslurm$i"
        ip link set "dlso$i" master "$BRIDGE"
        ip link set "dlso$i" up
        ip netns exec "dlslurm$i" ip link set lo up
        ip netns exec "dlslurm$i" ip addr add "$NET.$((i + 1))/24" dev "dlsi$i"
        ip netns exec "dlslurm$i" ip link set "dlsi$i" up
        # the notebook's scheduler listens on this machine's own address: reached through the bridge
        ip netns exec "dlslurm$i" ip route add default via "$NET.254"
    done
}

two_up() {
    install_packages
    [ "$(id -u)" = 0 ] || cannot "network namespaces and slurmd need root"
    for tool in ip nsenter; do
        command -v "$tool" >/dev/null || cannot "'$tool' is not installed (apt-get install iproute2 util-linux)"
    done
    ip netns add dlslurmprobe 2>/dev/null || cannot "cannot create a network namespace here"
    ip netns del dlslurmprobe
    two_down quiet
    two_conf
    two_net
    DIR="$TWO" start_munge
    export SLURM_CONF="$TWO/slurm.conf"
    slurmctld -c -f "$SLURM_CONF"
    # nsenter, not `ip netns exec`: that remounts /sys for the namespace, hiding /sys/fs/cgroup, and
    # slurmd then stops with "Unable to initialize cgroup plugin"
    nsenter --net=/run/netns/dlslurm0 slurmd -f "$SLURM_CONF" -N emu0
    nsenter --net=/run/netns/dlslurm1 slurmd -f "$SLURM_CONF" -N emu1
    for _ in $(seq 100); do
        if [ "$(sinfo -h -o %t | sort -u | tr '\n' ' ')" = "idle " ]; then
            say "two nodes up: emu0 ($NET.1), emu1 ($NET.2), partition two"
            echo "SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.2
    done
    tail -5 "$TWO"/log/*.log >&2 || true
    die "the two nodes did not become idle within 20 s (logs above; $TWO/log)"
}

two_down() {
    export SLURM_CONF="$TWO/slurm.conf"
    if alive "$TWO/slurmctld.pid"; then
        scancel --full --quiet --user=root 2>/dev/null || true
        for _ in $(seq 50); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    stop_pidfile "$TWO/slurmd-emu0.pid"
    stop_pidfile "$TWO/slurmd-emu1.pid"
    stop_pidfile "$TWO/slurmctld.pid"
    stop_pidfile "$TWO/munged.pid"
    for i in 0 1; do
        ip netns del "dlslurm$i" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    [ "${1:-}" = quiet ] || say "two nodes down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    two-up) two_up ;;
    two-down) two_down ;;
    *) die "usage: scripts/slurm.sh up|down|status|two-up|two-down" ;;
esac
