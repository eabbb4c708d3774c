#!/usr/bin/env bash
# Installs (Debian's packages) and starts a real Slurm on this one machine, for tests:
# munged, slurmctld, and one slurmd per emulated node. Idempotent enough for CI: every
# start wipes Slurm's state and starts fresh daemons. Stop with stop-slurm.sh.
#   SLURM_LOCAL_NODES=N   emulated nodes node1..nodeN (default 1: one node named after the host)
#   SLURM_LOCAL_CPUS=C    CPUs per node (default max(nproc, 32): the batch scripts ask for 4 tasks
#                         of 8 cores, as on a GPU node; more CPUs than cores is allowed here)
#   SLURM_LOCAL_GPUS=G    emulated GPUs per node (default 4; 0 for none): GRES `gpu` on dummy
#                         device files, so Slurm sets CUDA_VISIBLE_DEVICES as on a GPU node
set -euo pipefail
[ "$(id -u)" = 0 ] || exec sudo -E bash "$0" "$@"

nodes=${SLURM_LOCAL_NODES:-1}
cpus=${SLURM_LOCAL_CPUS:-$(( $(nproc) > 32 ? $(nproc) : 32 ))}
gpus=${SLURM_LOCAL_GPUS:-4}
host=$(hostname -s)
run=/run/slurm-local
logs=/var/log/slurm-local
spool=/var/spool/slurm-local
say() { echo "[start-slurm $(date +%T)] $*"; }

# Daemons start with stdio on a log and no other inherited descriptor (munged keeps
# them open otherwise, which can hold a CI step's pipe open).
daemon() { local log=$1; shift; "$@" </dev/null >>"$log" 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v srun >/dev/null; then
  say "installing slurmctld slurmd slurm-client munge (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

"$(dirname "$0")/stop-slurm.sh" >/dev/null 2>&1 || true
mkdir -p "$run" "$logs" "$spool"
rm -rf "${spool:?}"/*

# munge: its own user, its own run folder, a key.
mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
chmod 0755 /run/munge; chmod 0700 /var/log/munge /etc/munge
[ -s /etc/munge/munge.key ] || mungekey --create >/dev/null
chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  daemon "$logs/munged.out" runuser -u munge -- /usr/sbin/munged
  touch "$run/munged.started-by-slurm-local"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# Emulated GPUs: Slurm's gres/gpu wants a character device per GPU (a regular file is
# refused, a file-less count is dropped), so each is a copy of /dev/null (char 1,3) under
# $run. AutoDetect=off: there is no NVML to ask. Slurm then gives each job or task its
# CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS... exactly as on a GPU node; nothing is behind them.
gres=""
rm -f /etc/slurm/gres.conf
if [ "$gpus" -gt 0 ]; then
  mkdir -p /etc/slurm
  for i in $(seq 0 $((gpus - 1))); do
    dev=$run/gpu$i
    if [ ! -c "$dev" ]; then
      rm -f "$dev"
      if ! mknod -m 0666 "$dev" c 1 3; then
        say "cannot make the dummy device $dev (mknod refused): run with SLURM_LOCAL_GPUS=0 for no GPUs"
        exit 1
      fi
    fi
  done
  printf 'AutoDetect=off\nName=gpu File=%s/gpu[0-%d]\n' "$run" $((gpus - 1)) >/etc/slurm/gres.conf
  gres="Gres=gpu:$gpus "
fi

mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
if [ "$nodes" = 1 ]; then
  nodeline="NodeName=$host NodeHostname=$host NodeAddr=127.0.0.1 Port=6818 CPUs=$cpus RealMemory=$mem ${gres}State=UNKNOWN"
  names=$host
else
  nodeline="NodeName=node[1-$nodes] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-$((17000 + nodes))] CPUs=$cpus RealMemory=$((mem / nodes)) ${gres}State=UNKNOWN"
  names=$(seq -f 'node%g' 1 "$nodes")
  # The master address is the first node's name: it must resolve, as on a cluster.
  for n in $names; do grep -qE "^127\.0\.0\.1[[:space:]].*\b$n\b" /etc/hosts || echo "127.0.0.1 $n" >>/etc/hosts; done
fi
mkdir -p /etc/slurm
cat >/etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$logs/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
SchedulerParameters=batch_sched_delay=0
MinJobAge=4
ReturnToService=2
MailProg=/bin/true
MpiDefault=none
StateSaveLocation=$spool/slurmctld
SlurmdSpoolDir=$spool/slurmd-%n
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd-%n.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd-%n.log
TmpFS=/tmp
GresTypes=gpu
$nodeline
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

say "starting slurmctld"
daemon "$logs/slurmctld.out" slurmctld
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
for n in $names; do
  say "starting slurmd -N $n"
  daemon "$logs/slurmd-$n.out" slurmd -N "$n"
done
for _ in $(seq 150); do
  states=$(sinfo -h -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')
  [ "$states" = "idle " ] && break
  sleep 0.2
done
if [ "${states:-}" != "idle " ]; then
  say "nodes did not become idle (states: ${states:-none})"; sinfo -R || true; tail -n 20 "$logs"/*.log || true
  exit 1
fi
sinfo -N -o '%N %P %T %c %G'
say "Slurm is up: $nodes node(s) x $cpus CPUs x $gpus emulated GPUs, partition 'debug', logs in $logs"
