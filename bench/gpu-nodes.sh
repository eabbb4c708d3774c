#!/usr/bin/env bash
# Nodes of one GPU each, played on one GPU: a cluster's NCCL, rehearsed on one card.
#
# NCCL tells hosts apart by a hash of NCCL_HOSTID (else the hostname and boot id), and
# refuses two ranks of one host on one GPU ("Duplicate GPU detected"). Ranks that each
# set their own NCCL_HOSTID are, to NCCL, nodes of one GPU each: they connect through
# NCCL's network transport (sockets on loopback here), build inter-node rings and trees,
# and NCCL prints its tuning table for them. Every node here is a launcher of this machine
# (bench/nodes.sh) with SLURMD_NODENAME=NCCL_HOSTID=node-K and one rank on GPU 0.
#
# The figures are not a network's: the "network" is loopback and the GPU is shared. What
# is real is NCCL: its init, topology, channels, rings, trees, tuning and protocols across
# nodes, and the workbook's lessons on several ranks of a real NCCL.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: bench/gpu-nodes.sh [--nodes N] [--bin-dir DIR] [--out FILE] [--double] [--quick]

Runs the workbook on N nodes (default 4) of one GPU each, all on this machine's GPU 0,
and writes one report (markdown): each step's result, the perf sweeps with NCCL_ALGO
Ring and Tree and the tuner's choice, one with -A ring,tree -P ll,simple (whose rows
must run what each sweep asked), lesson 10's four ways (step, computing and exposed time),
and NCCL's INIT, GRAPH and TUNING lines of rank 0.
  --bin-dir DIR  the workbook's binaries (default: where cargo builds them)
  --out FILE     the report (default gpu-nodes-<host>-<date>.md)
  --double       on the NCCL test double (--simulate-gpus 1 per node): checks the script
  --quick        small sweeps (8 B to 1 MiB)
Exit status: 0 if every step passed, 1 if one failed, 2 on bad usage.
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/nodes.sh
. "$here/nodes.sh"
# shellcheck source=slurm/find-bins.sh
. "$here/../slurm/find-bins.sh"
# shellcheck source=bench/per-sweep.sh
. "$here/per-sweep.sh"

nodes=4 bins="" out="gpu-nodes-$(hostname -s)-$(date +%F).md" double=false perf_max=64M
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=${2:-}; shift 2 ;;
    --bin-dir) bins=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --double) double=true; shift ;;
    --quick) perf_max=1M; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-nodes.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $nodes in '' | *[!0-9]* | 0 | 1) echo "gpu-nodes.sh: --nodes wants a number from 2, not '$nodes'" >&2; exit 2 ;; esac
# Its nodes are processes on one GPU: in compute mode EXCLUSIVE_PROCESS the driver lets
# one process open it, unless an MPS server shares it (to the driver, one process).
if ! $double && command -v nvidia-smi >/dev/null 2>&1; then
  first=${CUDA_VISIBLE_DEVICES:-0}
  first=${first%%,*}
  mode=$(timeout 60 nvidia-smi --query-gpu=compute_mode --format=csv,noheader -i "$first" 2>/dev/null | head -n 1)
  if [ "$mode" = Exclusive_Process ] && ! pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1 &&
    [ ! -p "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]; then
    echo "gpu-nodes.sh: GPU $first is in compute mode Exclusive_Process and no MPS server runs: its $nodes nodes cannot share it (start MPS: nvidia-cuda-mps-control -d)" >&2
    exit 2
  fi
fi
if [ -n "$bins" ]; then export NCCL_WORKBOOK_BIN_DIR=$bins; fi
find_workbook_bins 00-nccl-hello-world 02-nccl-allreduce 07-nccl-perf 09-nccl-split 10-nccl-overlap || exit 2
bins=$WORKBOOK_BIN_DIR

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-nodes.XXXXXX")
trap 'rm -rf "$work"' EXIT
gpu=(--backend nccl)
$double && gpu=(--simulate-gpus 1)
# Loopback is the only network here; NCCL skips it unless told (and InfiniBand is absent).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}

failed=0 rows=()
# step NAME WANT ENV... -- BIN ARGS...: one job on the nodes; passes if it ends 0 and
# rank 0's output has a line matching WANT. Its output stays in $work/NAME.K.
step() {
  local name=$1 want=$2 envs=() t0 verdict
  shift 2
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local bin=$1
  shift
  if [ ! -x "$bins/$bin" ]; then # the exercises' solutions, when only the lessons were copied
    rows+=("| $name | SKIP | $bin is not in $bins | 0 s |")
    echo "gpu-nodes: $name: SKIP" >&2
    return
  fi
  mkdir -p "$work/$name"
  t0=$(date +%s)
  # Each node's NCCL_HOSTID is its name: one host per node, to NCCL.
  # shellcheck disable=SC2016 # $SLURMD_NODENAME is the node's, expanded by its own shell
  if (on_nodes "$work/$name" "$nodes" "$name" env "${envs[@]}" bash -c 'NCCL_HOSTID=$SLURMD_NODENAME exec "$@"' _ \
    "$bins/$bin" "${gpu[@]}" --nproc-per-node 1 --timeout 60 "$@") 2>"$work/$name/why"; then
    if grep -q -- "$want" "$work/$name/out.0"; then
      verdict="PASS | $(grep -m 1 -- "$want" "$work/$name/out.0")"
    else
      verdict="FAIL | no line '$want' in rank 0's output"
      failed=1
    fi
  else
    verdict="FAIL | $(tr '\n' ' ' <"$work/$name/why" | cut -c 1-300)"
    failed=1
  fi
  rows+=("| $name | $verdict | $(($(date +%s) - t0)) s |")
  echo "gpu-nodes: $name: ${verdict%% |*}" >&2
}

step hello "^Hello from $nodes ranks" -- 00-nccl-hello-world
step allreduce "^Check: OK" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING,NET -- 02-nccl-allreduce --size 16M
step split "^Check: OK" -- 09-nccl-split --tp 2
step hierarchical "^Check: OK" -- sol12-hierarchical-allreduce --per-node 2
step grouped-alltoall "^Check: OK" -- sol13-grouped-alltoall
# Overlap (lesson 10): NCCL on a stream of its own, ordered by events against the
# layers' kernels, on several ranks of a real NCCL; its four ways' lines go in the report.
step overlap "^FSDP: forward, next layer prefetched" -- 10-nccl-overlap
for algo in Ring Tree; do
  step "perf-$algo" "^# Out of bounds values : 0 OK" NCCL_ALGO=$algo -- 07-nccl-perf -b 8 -e "$perf_max" -f 4 --fit
done
step perf-tuner "^# Out of bounds values : 0 OK" -- 07-nccl-perf -b 8 -e "$perf_max" -f 4 --fit
# -A and -P on NCCL across the nodes: each sweep on a communicator NCCL started under its
# NCCL_ALGO and NCCL_PROTO, and NCCL's own choice (the algo proto column) following it.
# On the double, a version that prints its choices (2.18, its default, prints none).
played=()
$double && played=("NCCL_DOUBLE_VERSION=${NCCL_DOUBLE_VERSION:-22803}")
step perf-per-sweep "^# -P simple: " "${played[@]}" -- 07-nccl-perf -b 8 -e 1M -f 32 -n 5 -w 2 -A ring,tree -P ll,simple
if [ -f "$work/perf-per-sweep/out.0" ] && [ "${rows[-1]#| perf-per-sweep | PASS}" != "${rows[-1]}" ]; then
  read -r followed asked unknown < <(per_sweep_rows "$work/perf-per-sweep/out.0")
  said="$followed of $asked rows ran what their sweep's NCCL_ALGO and NCCL_PROTO asked, by NCCL's own lines"
  if [ "$asked" = 0 ] || [ $((followed + unknown)) != "$asked" ]; then
    rows[-1]="| perf-per-sweep | FAIL | $said | ${rows[-1]##*| }"
    failed=1
    echo "gpu-nodes: perf-per-sweep: FAIL ($said)" >&2
  elif [ "$unknown" = "$asked" ]; then
    rows[-1]="| perf-per-sweep | PASS | $asked rows in 4 sweeps; NCCL printed no choice (2.18 and 2.19 print none) | ${rows[-1]##*| }"
  else
    rows[-1]="| perf-per-sweep | PASS | $said | ${rows[-1]##*| }"
  fi
fi

{
  echo "# The workbook on $nodes nodes of one GPU each, on one GPU ($(hostname -s), $(date '+%F %T %Z'))"
  echo
  echo "Every node is a launcher here with its own NCCL_HOSTID and one rank on GPU 0;"
  echo "NCCL connects them over loopback sockets (NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME)."
  echo "What is real: NCCL's init, topology, rings, trees, tuning table and choices across nodes, and"
  echo "every check. What is not: the times. The ranks' processes time-share the one GPU (no MPS),"
  echo "so a step that needs another rank's kernel waits for the GPU's time slice (milliseconds):"
  echo "the sweeps' times say how the GPU is shared, not how fast NCCL or a network is."
  $double && echo "On the NCCL test double (--simulate-gpus 1 per node), not a GPU."
  echo
  echo "| step | result | what rank 0 said | time |"
  echo "|---|---|---|---:|"
  printf '%s\n' "${rows[@]}"
  for algo in Ring Tree tuner per-sweep; do
    [ -f "$work/perf-$algo/out.0" ] || continue
    echo
    case $algo in
      tuner) echo "## 07-nccl-perf, NCCL's own choice" ;;
      per-sweep) echo "## 07-nccl-perf -A ring,tree -P ll,simple: NCCL_ALGO and NCCL_PROTO per sweep" ;;
      *) echo "## 07-nccl-perf, NCCL_ALGO=$algo" ;;
    esac
    echo
    echo '```'
    cat "$work/perf-$algo/out.0"
    echo '```'
  done
  if [ -f "$work/overlap/out.0" ]; then
    echo
    echo "## 10-nccl-overlap, rank 0: each way's step, computing and exposed time (ms)"
    echo
    echo '```'
    grep -E '^(Model|Rank 0|DDP|FSDP|Check)' "$work/overlap/out.0"
    echo '```'
  fi
  if [ -f "$work/allreduce/out.0" ]; then
    echo
    echo "## NCCL's INIT, GRAPH, TUNING and NET lines, rank 0 (02-nccl-allreduce --size 16M)"
    echo
    echo '```'
    grep -h -E ' NCCL (INFO|WARN) ' "$work/allreduce/out.0" "$work/allreduce/err.0" | head -400 ||
      echo "(none: $($double && echo "the NCCL test double prints no INIT, GRAPH or TUNING lines" || echo "NCCL printed none"))"
    echo '```'
  fi
} >"$out"
echo "gpu-nodes: report in $out" >&2
exit "$failed"
