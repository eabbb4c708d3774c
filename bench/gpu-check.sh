#!/usr/bin/env bash
# The workbook's GPU acceptance check: run it once on a GPU node, by hand (or in a job),
# and read the one report it writes. See --help.
#
# It needs only what a GPU node has: the NVIDIA driver, NCCL (a module, or the pip wheel
# nvidia-nccl-cu12), bash and coreutils; cargo is optional (without it, give binaries
# built elsewhere). It installs nothing, and every step has a time limit.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: bench/gpu-check.sh [--out FILE] [--bin-dir DIR] [--no-build] [--perf-max SIZE]

Checks the workbook on this GPU node, once, and writes one report (markdown):
  - builds it (cargo build --release) if cargo is here, else takes built binaries;
  - finds the GPUs (nvidia-smi -L, else the program's own probe), the driver's version,
    NCCL's version and the library file loaded;
  - runs every lesson (00-nccl-hello-world to 10-nccl-overlap, 07-nccl-perf with every
    collective, operator and type: --coll all -o all -d all) with --backend nccl, one
    rank per GPU (08-cudarc-allreduce calls cudarc's NCCL API directly; 10-nccl-overlap's
    four ways, step, computing and exposed time, go into the report); 02 with
    --show-calls (every rank shows its ncclAllReduce calls);
  - runs the exercises' checker on NCCL (cargo workbook check --all --solution
    --backend nccl; needs cargo and 2 GPUs);
  - 07-nccl-perf -A ring,tree -P ll,simple (2 GPUs or more; on one, across the nodes
    of bench/gpu-nodes.sh): every row runs what its sweep asked, as NCCL's own TUNING
    lines say;
  - a 07-nccl-perf sweep (-b 8 -e 256M -f 2) with NCCL_DEBUG=INFO: the table and NCCL's
    lines go into the report;
  - one all-reduce (02-nccl-allreduce, one rank per GPU, --size 64M) with NCCL_DEBUG=INFO
    and NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING: NCCL's rings, trees and tuning table, the
    first 300 lines of each rank, in their own section of the report;
  - two ranks given the same GPU (CUDA_VISIBLE_DEVICES) must be refused: by the workbook
    (exit 2 and a one-line error naming the GPU), or, on a GPU in EXCLUSIVE_PROCESS
    compute mode (nvidia-smi --query-gpu=compute_mode), by the driver (CUDA's "busy or
    unavailable" on one rank, the other ending by its --timeout); the report says which
    and why. A hang, a panic or an exit 0 is a failure;
  - with 2 GPUs or more: one rank killed (kill -9), then one stopped (kill -STOP), in
    the middle of a large all-reduce: every other rank must end within its --timeout
    (20 s) and a few seconds, naming that rank, and nothing may be left running; and
    ranks each given their own GPU (CUDA_VISIBLE_DEVICES=i), as Slurm's per-task
    binding does, must run;
  - NCCL's transport between this node's GPUs (its "Channel ... via" lines in the steps
    above): P2P (NVLink or PCIe) passes; SHM or NET between GPUs of one node is a WARN
    (what a peer GPU hidden by Slurm's per-task binding leaves: see docs/nccl-backend.md).
Exit status: 0 only if every step passed (a step skipped for want of cargo or GPUs, or
a WARN, is not a failure, and the report says why); 1 if one failed; 2 on bad usage or
no GPU.

MIG: a CUDA process sees one MIG device only (CUDA enumerates the first MIG instance
CUDA_VISIBLE_DEVICES lists). Where CUDA_VISIBLE_DEVICES names MIG devices (MIG-...), or
is unset and nvidia-smi -L lists some, the report says so, and every multi-rank step
starts one rank per MIG device, each with its own CUDA_VISIBLE_DEVICES=<MIG-uuid>,
instead of --nproc-per-node; the exercises' checker, whose ranks share one
CUDA_VISIBLE_DEVICES, is skipped. One MIG device per GPU: the MIG devices of one GPU
share its PCI bus id, and NCCL refuses two ranks of one host on one bus id ("Duplicate
GPU detected"); so on one GPU the steps that need 2 ranks are skipped, and say why.

EXCLUSIVE_PROCESS compute mode: the steps that put several processes on one GPU (on one
GPU: the 4 nodes of one GPU each, the kill and stop cases) are skipped, and say why,
unless an MPS server runs (nvidia-cuda-mps-control, or CUDA_MPS_PIPE_DIRECTORY/control).

A compute node with no network: cargo build needs crates.io, unless the crates are
already in ~/.cargo (a build or `cargo fetch` on the login node puts them there, and nodes
that share $HOME then build offline). If the build fails for want of network, the report
says so. Either build on the login node and run this with --no-build (same folder) or
--bin-dir DIR (binaries copied elsewhere; the exercises' checker still needs cargo and
the crates), or vendor the crates: on a machine with network, in the workbook's folder,
  cargo vendor --locked vendor >>.cargo/config.toml   # the crates, and the [source]
                                                     # lines that make cargo use them
copy the folder (vendor/ included) to the cluster, then on the node:
  cargo build --release --offline && bench/gpu-check.sh --no-build

Options:
  --out FILE       the report (default: gpu-check-<host>-<date>.md in the current folder)
  --bin-dir DIR    use the binaries in DIR (built elsewhere) instead of building; without
                   it and without cargo, they are looked for where cargo puts them
                   (slurm/find-bins.sh: NCCL_WORKBOOK_BIN_DIR, cargo metadata,
                   CARGO_TARGET_DIR/release, ./target/release)
  --no-build       do not run cargo build (use what is built: on the login node, say)
  --perf-max SIZE  the perf sweep's largest size (default 256M)
  --nccl-tests P   nccl-tests' all_reduce_perf (the file, or nccl-tests' folder holding
                   build/all_reduce_perf): run beside the perf sweep, same sizes, same
                   GPUs, and the two busbw columns (algbw on one GPU) set side by side
                   (else NCCL_TESTS, or all_reduce_perf on PATH; without any, the step
                   is skipped). A judged size below 95% of nccl-tests' is retaken (both
                   programs three times in turn, -n 100, medians) before it fails. It runs
                   on the libnccl file the workbook's ranks mapped (LD_PRELOAD), and both
                   must print the same NCCL version. Build it on the login node: git clone
                   https://github.com/NVIDIA/nccl-tests; make -C nccl-tests CUDA_HOME=...
                   NCCL_HOME=...
  -h, --help       this help

Environment:
  CUDA_VISIBLE_DEVICES     if set (as Slurm sets it), only those GPUs are used
  NCCL_LIBRARY, NCCL_HOME  which NCCL the programs load (else the pip wheel of the
                           active environment, libnccl.so on the loader's path,
                           LD_LIBRARY_PATH, the system's)
  GPU_CHECK_ON_DOUBLE=1    a dry run with no GPU, on the workbook's NCCL test double
                           (target/release/libnccl_double.so, as CI uses it), with
                           GPU_CHECK_DOUBLE_DEVICES (default 4) emulated GPUs: for
                           testing this script, never an acceptance
  GPU_CHECK_DOUBLE_MIG=N   with the double: N MIG devices on each of its GPUs, given to
                           the ranks as MIG devices are (one per GPU, one rank each, its
                           own CUDA_VISIBLE_DEVICES), to test that
  GPU_CHECK_DOUBLE_COMPUTE_MODE=MODE  with the double: the compute mode nvidia-smi would
                           say (Exclusive_Process), which the double does not enforce
EOF
}

start_dir=$PWD
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
host=$(hostname -s 2>/dev/null || hostname)
stamp=$(date +%Y%m%d-%H%M%S)
out="" bin_dir="" build=true perf_max=256M nccl_tests=${NCCL_TESTS:-}
command_line="bench/gpu-check.sh${*:+ $*}"
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a file}; shift 2 ;;
    --out=*) out=${1#*=}; shift ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a folder}; shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --no-build) build=false; shift ;;
    --perf-max) perf_max=${2:?--perf-max needs a size}; shift 2 ;;
    --perf-max=*) perf_max=${1#*=}; shift ;;
    --nccl-tests) nccl_tests=${2:?--nccl-tests needs a file or folder}; shift 2 ;;
    --nccl-tests=*) nccl_tests=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-gpu-check-$host-$stamp.md}
case $out in /*) ;; *) out=$start_dir/$out ;; esac
if [ -n "$bin_dir" ]; then
  [ -d "$bin_dir" ] || { echo "error: --bin-dir $bin_dir is not a folder" >&2; exit 2; }
  bin_dir=$(cd "$bin_dir" && pwd)
fi
cd "$repo" || exit 2

# Limits: the ranks' own --timeout, and what a rank gets beyond it to end after a fault.
rank_timeout=20 grace=10

exec 3>&2 # progress goes there, even while bash's notes on killed ranks go to a file
say() { echo "[gpu-check $(date +%T)] $*" >&3; }

# ---------------------------------------------------------------------------------------
# 1. Is there a GPU? Answer fast, before building anything.
on_double=${GPU_CHECK_ON_DOUBLE:-0}
gpu_list="" driver="" gpus=0 gpu_note=""
visible=()
# MIG: a process sees one MIG device only, so every multi-rank step gives each rank its own
# CUDA_VISIBLE_DEVICES (the devices in visible[]). compute_modes: nvidia-smi's
# "index, uuid, mode" lines (EXCLUSIVE_PROCESS: one process per GPU, the driver enforces it).
mig=false compute_modes="" mig_left_out=0
# Set where several processes cannot share a GPU here (EXCLUSIVE_PROCESS, no MPS), or can
# only through MPS (the note).
shared_gpu_why="" shared_gpu_note=""
# (Slurm may set NoDevFiles where a job has no GPU: that names none.)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$CUDA_VISIBLE_DEVICES" != NoDevFiles ]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
fi
if [ "$on_double" = 1 ]; then
  gpus=${GPU_CHECK_DOUBLE_DEVICES:-4}
  [[ $gpus =~ ^[1-9][0-9]*$ ]] || { echo "error: GPU_CHECK_DOUBLE_DEVICES=$gpus is not a number of GPUs" >&2; exit 2; }
  gpu_list="$gpus emulated GPUs of the NCCL test double (GPU_CHECK_ON_DOUBLE=1): NOT a GPU node"
  driver="none: the NCCL test double stands in for the CUDA driver and NCCL"
  visible=()
  per_gpu=${GPU_CHECK_DOUBLE_MIG:-0}
  [[ $per_gpu =~ ^[0-7]$ ]] || { echo "error: GPU_CHECK_DOUBLE_MIG=$per_gpu is not a number of MIG devices per GPU (0 to 7)" >&2; exit 2; }
  if [ "$per_gpu" != 0 ]; then
    # To test the MIG plan: nvidia-smi -L's lines of GPUs with MIG devices, played (the
    # double knows no MIG id: gpu_id gives a rank its GPU's index instead).
    for ((i = 0; i < gpus; i++)); do
      gpu_list+=$'\n'"GPU $i: simulated GPU $i (UUID: GPU-double-$i)"
      for ((j = 0; j < per_gpu; j++)); do
        gpu_list+=$'\n'"  MIG 1g.10gb     Device  $j: (UUID: MIG-double-$i-$j)"
        visible+=("MIG-double-$i-$j")
      done
    done
    mig=true
    gpu_note="GPU_CHECK_DOUBLE_MIG=$per_gpu: $per_gpu MIG device(s) on each GPU, played"
  fi
  mode=${GPU_CHECK_DOUBLE_COMPUTE_MODE:-}
  case $mode in
    "") ;;
    Default | Exclusive_Process | Prohibited)
      for ((i = 0; i < gpus; i++)); do compute_modes+="${compute_modes:+$'\n'}$i, GPU-double-$i, $mode"; done ;;
    *) echo "error: GPU_CHECK_DOUBLE_COMPUTE_MODE=$mode is not Default, Exclusive_Process or Prohibited" >&2; exit 2 ;;
  esac
else
  have_smi=false
  command -v nvidia-smi >/dev/null 2>&1 && have_smi=true
  if ! $have_smi && [ ! -e /proc/driver/nvidia/version ] && ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    echo "error: no GPU: this script checks a GPU node (no nvidia-smi, no /proc/driver/nvidia, no /dev/nvidia*)." >&2
    echo "Run it on a GPU node (e.g. srun --gres=gpu:4 --pty bash, then bench/gpu-check.sh)." >&2
    echo "(GPU_CHECK_ON_DOUBLE=1 runs it on the NCCL test double instead, to test this script.)" >&2
    exit 2
  fi
  if $have_smi; then
    gpu_list=$(timeout 60 nvidia-smi -L 2>&1)
    gpus=$(grep -c '^GPU ' <<<"$gpu_list")
    driver=$(timeout 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    compute_modes=$(timeout 60 nvidia-smi --query-gpu=index,uuid,compute_mode --format=csv,noheader 2>/dev/null |
      grep -E '^ *[0-9]+ *,')
  fi
  if [ -z "$driver" ] && [ -r /proc/driver/nvidia/version ]; then driver=$(head -n 1 /proc/driver/nvidia/version); fi
  # nvidia-smi -L shows a GPU's MIG devices under it, indented: "  MIG 1g.10gb Device 0:
  # (UUID: MIG-...)" (older drivers: MIG-GPU-<uuid>/<gi>/<ci>).
  mig_listed=$(grep -cE '^[[:space:]]+MIG ' <<<"$gpu_list")
  if [ ${#visible[@]} -gt 0 ]; then
    gpus=${#visible[@]}
    mig_named=$(printf '%s\n' "${visible[@]}" | grep -c '^MIG-')
    if [ "$mig_named" -gt 0 ]; then
      mig=true
      gpu_note="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: $gpus device(s), $mig_named of them MIG devices"
    else
      gpu_note="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: ${#visible[@]} of the node's GPUs are used"
    fi
  elif [ "$mig_listed" -gt 0 ]; then
    # No CUDA_VISIBLE_DEVICES, MIG devices listed: one rank on each, and on each GPU that
    # has none (by UUID).
    mig=true
    while IFS= read -r line; do
      if [[ $line =~ ^GPU\ .*\(UUID:\ (GPU-[^\)]*)\) ]]; then
        visible+=("${BASH_REMATCH[1]}")
      elif [[ $line =~ ^[[:space:]]+MIG\ .*\(UUID:\ (MIG-[^\)]*)\) ]]; then
        # A GPU with MIG devices: its MIG devices, not the GPU itself.
        [ ${#visible[@]} -gt 0 ] && [[ ${visible[-1]} == GPU-* ]] && unset 'visible[-1]'
        visible+=("${BASH_REMATCH[1]}")
      fi
    done <<<"$gpu_list"
    gpus=${#visible[@]}
    gpu_note="CUDA_VISIBLE_DEVICES unset, nvidia-smi lists $mig_listed MIG device(s): $gpus device(s) used, one rank on each"
  fi
  if $have_smi && [ "$gpus" = 0 ]; then
    echo "error: no GPU: nvidia-smi lists none on this node:" >&2
    echo "$gpu_list" >&2
    exit 2
  fi
fi
# The GPU (its UUID) of MIG device $1, from nvidia-smi -L (which lists a GPU's MIG devices
# under it); "" if unknown.
mig_parent() {
  awk -v id="$1" '/^GPU /{g=$0; sub(/.*UUID: /, "", g); sub(/\).*/, "", g)}
    index($0, id) && /^[[:space:]]+MIG /{print g; exit}' <<<"$gpu_list"
}
# One MIG device per GPU: the MIG devices of one GPU share its PCI bus id, and NCCL refuses
# two ranks of one host on one bus id ("Duplicate GPU detected", init.cc, 2.18 to 2.30).
if $mig; then
  kept=() parents=" "
  for id in "${visible[@]}"; do
    parent=$id
    [[ $id == MIG-* ]] && parent=$(mig_parent "$id")
    if [ -n "$parent" ] && [[ $parents == *" $parent "* ]]; then
      mig_left_out=$((mig_left_out + 1))
      continue
    fi
    parents+="$parent "
    kept+=("$id")
  done
  visible=("${kept[@]}")
  gpus=${#visible[@]}
  if [ "$mig_left_out" != 0 ]; then
    gpu_note+="; one MIG device per GPU: $gpus used, $mig_left_out left out (the MIG devices of one GPU share its PCI bus id, which NCCL refuses as a duplicate GPU)"
  fi
fi
# Why the steps that need 2 ranks on 2 GPUs cannot run on this one GPU.
one_gpu_why="one GPU: it needs 2 GPUs"
if $mig && [ "$gpus" = 1 ]; then
  one_gpu_why="MIG on one GPU: 2 ranks need 2 GPUs (the MIG devices of one GPU share its PCI bus id, and NCCL refuses two ranks on one bus id: \"Duplicate GPU detected\")"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
run_id="$$-$stamp"
export GPU_CHECK_RUN=$run_id # marks every process this check starts (found again in /proc)
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  if declare -F reap_leftovers >/dev/null; then reap_leftovers >/dev/null; fi
  rm -rf "$tmp" "${double_rooms:-}"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

# Processes of other jobs' launchers must not decide who our ranks are.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT \
  TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_RUN_ID NCCL_WORKBOOK_JOB_ID NCCL_WORKBOOK_LAUNCHED \
  NCCL_WORKBOOK_NCCL_DIR NO_COLOR
unset NCCL_DEBUG_FILE # NCCL's lines (NCCL_DEBUG=INFO) go to the ranks' output, into the report
for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done
bins=""

# ---------------------------------------------------------------------------------------
# The report: steps in order, their details, and what was learnt on the way.
names=() results=() reasons=() times=()
details=$tmp/details.md
: >"$details"
failed=0 warned=0

# record NAME RESULT REASON SECONDS COMMAND LOG...: one step, in the table and the details.
record() {
  local name=$1 result=$2 reason=$3 secs=$4 cmd=$5 log
  shift 5
  names+=("$name") results+=("$result") reasons+=("$reason") times+=("$secs")
  [ "$result" = FAIL ] && failed=$((failed + 1))
  [ "$result" = WARN ] && warned=$((warned + 1))
  say "$result  $name${reason:+: $reason}"
  {
    echo "### $name: $result"
    echo
    [ -n "$reason" ] && { echo "$reason"; echo; }
    if [ -n "$cmd" ]; then echo '```'; echo "$cmd"; echo '```'; echo; fi
    for log in "$@"; do
      [ -s "$log" ] || continue
      local n
      n=$(wc -l <"$log")
      echo "<details><summary>$(basename "$log") ($n lines$([ "$n" -gt 80 ] && echo ", the last 80"))</summary>"
      echo
      echo '```'
      tail -n 80 "$log"
      echo '```'
      echo "</details>"
      echo
    done
  } >>"$details"
}

# The command line of CMD..., quoted so that it can be pasted into a shell.
cmdline() {
  local a s=""
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./,:=+@%-]+$ ]]; then s+=" $a"; else s+=" $(printf '%q' "$a")"; fi
  done
  printf '%s' "${s# }"
}

# The workbook's programs this check started that still run: the GPU_CHECK_RUN mark in
# their environment, and their executable in the binaries' folder.
ours() {
  local p exe
  [ -n "${bins:-}" ] || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
    [[ $exe == "$bins"/* ]] || continue
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "GPU_CHECK_RUN=$run_id"; then echo "$p"; fi
  done
}

# Ends what is left of a step (stopped ones first resumed), and says what it was.
reap_leftovers() {
  local left p
  left=$(ours)
  [ -z "$left" ] && return 0
  for p in $left; do
    printf 'pid %s (%s); ' "$p" "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | sed 's/ $//')"
    kill -CONT "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
  done
  return 1
}

# run_step NAME LIMIT LOG CMD...: runs CMD (stdout and stderr in LOG) within LIMIT seconds;
# sets rc, secs and cmd for the caller to judge.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  cmd=$(cmdline "$@")
  say "running: $name ($cmd)"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 </dev/null
  rc=$?
  secs=$((SECONDS - t0))
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then timed_out=true; else timed_out=false; fi
}

# ---------------------------------------------------------------------------------------
# 2. The binaries: built here, or given.
have_cargo=false
command -v cargo >/dev/null 2>&1 && have_cargo=true
build_note=""
# Whether cargo's log $1 says it could not reach crates.io (or was told --offline, and lacks
# a crate): compute nodes often have no network.
no_network() {
  grep -qiE "Could(n't| not) (resolve (host|proxy)|connect to server)|Timeout was reached|network is unreachable|\
spurious network error|failed to download from|download of .* failed|unable to update registry|\
you're using offline mode|--offline was specified|SSL connect error" "$1"
}
offline_advice="on the login node (which has network), in $repo: cargo build --release (it also fills \
~/.cargo, from which a node sharing \$HOME then builds offline), then rerun this with --no-build (or --bin-dir DIR \
for binaries copied elsewhere); or, on a machine with network: cargo vendor --locked vendor >>.cargo/config.toml, \
copy the folder here and run cargo build --release --offline (see --help)"
build_offline="" # the advice, once the build failed for want of network
if [ -n "$bin_dir" ]; then
  export NCCL_WORKBOOK_BIN_DIR=$bin_dir
  build_note="given with --bin-dir"
elif $build && $have_cargo; then
  log=$tmp/build.log
  run_step "build" 3600 "$log" cargo build --release
  if [ "$rc" = 0 ] && [ "$on_double" = 1 ]; then
    timeout 1800 cargo build --release -p nccl-double --lib >>"$log" 2>&1 </dev/null || rc=$?
  fi
  if [ "$rc" = 0 ]; then
    record "build" PASS "" "$secs" "$cmd" "$log"
  elif no_network "$log"; then
    build_offline=$offline_advice
    record "build" FAIL "cargo build --release could not download the crates from crates.io (exit $rc): no network \
here, as often on compute nodes. What to do: $offline_advice" "$secs" "$cmd" "$log"
  else
    record "build" FAIL "cargo build --release failed (exit $rc)" "$secs" "$cmd" "$log"
  fi
  build_note="built here with cargo"
  [ "$rc" = 0 ] || build_note="cargo build failed here$([ -n "$build_offline" ] && echo " (no network)"), so built before"
elif ! $have_cargo; then
  build_note="no cargo here: binaries already built"
else
  build_note="--no-build: binaries already built"
fi
# shellcheck source=slurm/find-bins.sh
source "$repo/slurm/find-bins.sh"
# shellcheck source=bench/per-sweep.sh
source "$repo/bench/per-sweep.sh"
# Every lesson, from its folder (workbook_lessons, slurm/find-bins.sh).
mapfile -t examples < <(workbook_lessons)
need=(${examples[@]+"${examples[@]}"})
[ "$on_double" = 1 ] && need+=(libnccl_double.so)
if ! find_workbook_bins "${need[@]}" 2>"$tmp/find.log"; then
  cat "$tmp/find.log" >&2
  record "binaries" FAIL "the workbook's binaries were not found (give --bin-dir DIR)" 0 "" "$tmp/find.log"
  bins=""
else
  bins=$WORKBOOK_BIN_DIR
  build_note+="; $bins ($WORKBOOK_BIN_FROM)"
fi

if [ "$on_double" = 1 ] && [ -n "$bins" ]; then
  mkdir -p "$tmp/double"
  for n in libcuda.so libcuda.so.1 libnccl.so libnccl.so.2; do ln -s "$bins/libnccl_double.so" "$tmp/double/$n"; done
  export LD_LIBRARY_PATH=$tmp/double${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export NCCL_DOUBLE=1 NCCL_DOUBLE_DEVICES=$gpus
  unset NCCL_DOUBLE_HOST
  # The double's meeting folders: a killed rank never leaves its own, so they go in a
  # folder of this run's (in /dev/shm, where the double is quick), removed at the end.
  double_rooms=$(mktemp -d /dev/shm/gpu-check-rooms.XXXXXX 2>/dev/null || mktemp -d "$tmp/rooms.XXXXXX")
  export NCCL_DOUBLE_DIR=$double_rooms
fi

# The i-th GPU as CUDA_VISIBLE_DEVICES names it (within an allocation: its own names). The
# double knows no MIG id: its played MIG device MIG-double-<gpu>-<k> is the GPU's index.
gpu_id() {
  local id=$1
  [ ${#visible[@]} -gt 0 ] && id=${visible[$1]}
  if [ "$on_double" = 1 ] && [[ $id =~ ^MIG-double-([0-9]+)- ]]; then id=${BASH_REMATCH[1]}; fi
  echo "$id"
}
# Whether an MPS server runs here, sharing each GPU among its clients (which EXCLUSIVE_PROCESS
# then lets in): its control daemon, or its pipe. Says which.
mps_running() {
  local pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control
  if command -v pgrep >/dev/null 2>&1 && pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "the MPS control daemon runs"
  elif [ -p "$pipe" ]; then
    echo "MPS's pipe $pipe is there"
  else
    return 1
  fi
}
# The compute mode of the GPU CUDA_VISIBLE_DEVICES=$1 names, from nvidia-smi
# (Default, Exclusive_Process, Prohibited), or "" if unknown. Usually every GPU of a node
# has the same; else the GPU is found by UUID (a MIG device's: its GPU's), then by index.
mode_of() {
  local id=$1 modes parent=""
  [ -n "$compute_modes" ] || return 0
  modes=$(awk -F', *' '{print $3}' <<<"$compute_modes" | sort -u)
  if [ "$(grep -c . <<<"$modes")" = 1 ]; then echo "$modes"; return; fi
  if [[ $id == MIG-* ]]; then
    parent=$(mig_parent "$id")
    id=$parent
  fi
  if [[ $id == GPU-* ]]; then
    awk -F', *' -v id="$id" 'index($2, id) == 1 {print $3; exit}' <<<"$compute_modes"
  elif [[ $id =~ ^[0-9]+$ ]]; then
    awk -F', *' -v id="$id" '$1 + 0 == id {print $3; exit}' <<<"$compute_modes"
  fi
}
# A port for a rendezvous started by hand: free, as far as /proc/net/tcp knows.
free_port() {
  local p hex
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 30000))
    hex=$(printf ':%04X ' "$p")
    if ! grep -q "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null; then echo "$p"; return; fi
  done
  echo 29599
}
# Whether pid $1 has ended (gone, or a zombie not yet waited for).
ended() { [ ! -e "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

nccl_version="" nccl_line="" nccl_mapped="" nccl_version_info=""
perf_table="" nccl_info=""
debug_note="" debug_dir="" debug_keep=300

if [ -n "$bins" ]; then
  # -------------------------------------------------------------------------------------
  # 3. The program's own probe: what it sees (GPUs, NCCL), and which libnccl it loads.
  log=$tmp/probe.json err=$tmp/probe.stderr
  cmd=$(cmdline "$bins/00-nccl-hello-world" --backend nccl --format json --timeout 60)
  say "running: probe ($cmd)"
  t0=$SECONDS
  timeout -k 10 180 "$bins/00-nccl-hello-world" --backend nccl --format json --timeout 60 \
    >"$log" 2>"$err" </dev/null
  rc=$? secs=$((SECONDS - t0))
  cp "$err" "$tmp/probe.errors"
  world=$(sed -n 's/^ *"world_size": *\([0-9]*\).*/\1/p' "$log" | head -n 1)
  nccl_version=$(sed -n 's/^ *"nccl_version": *"\([^"]*\)".*/\1/p' "$log" | head -n 1)
  nccl_line=$(sed -n 's/^ *"backend_reason": *"\(.*\)",*$/\1/p' "$log" | head -n 1)
  names_seen=$(sed -n 's/^ *"device_name": *"\([^"]*\)".*/\1/p' "$log" | sort | uniq -c | sed 's/^ *\([0-9]*\) /\1 x /' | tr '\n' ';')
  if [ "$rc" != 0 ]; then
    record "probe" FAIL "00-nccl-hello-world --backend nccl failed (exit $rc): NCCL does not run here" "$secs" "$cmd" "$log" "$tmp/probe.errors"
  elif ! grep -q '"backend": "nccl"' "$log"; then
    record "probe" FAIL "the program did not pick NCCL: ${nccl_line:-no backend line}" "$secs" "$cmd" "$log" "$tmp/probe.errors"
  elif $mig; then
    record "probe" PASS "one process sees ${world:-no} device(s) (MIG: one MIG device per process; the ranks are given one each), NCCL $nccl_version; devices: ${names_seen%;}" "$secs" "$cmd" "$log"
  elif [ "$gpus" != 0 ] && [ "${world:-0}" != "$gpus" ]; then
    record "probe" FAIL "the program sees ${world:-no} GPU(s), nvidia-smi/CUDA_VISIBLE_DEVICES $gpus" "$secs" "$cmd" "$log" "$tmp/probe.errors"
  else
    record "probe" PASS "$world GPU(s), NCCL $nccl_version; devices: ${names_seen%;}" "$secs" "$cmd" "$log"
  fi
  [ "$gpus" = 0 ] && gpus=${world:-0}
fi

if [ -n "$bins" ] && [ "$gpus" -gt 0 ]; then
  # -------------------------------------------------------------------------------------
  # Ranks started by hand, as Slurm's tasks are: start_ranks EXAMPLE WORLD GPU_OF_RANK
  # ARGS...; GPU_OF_RANK is 'each' (rank i sees only GPU i), 'same' (every rank sees only
  # the first GPU) or 'all' (every rank sees them all); rank_env[] (VAR=value...) goes
  # into every rank's environment. Sets pids[], port, and logs in $tmp/hand/rank<R>.{out,err}.
  rank_env=()
  start_ranks() {
    local ex=$1 world=$2 gpu_of=$3 r
    shift 3
    port=$(free_port)
    pids=() codes=() ended_at=()
    rm -rf "$tmp/hand"
    mkdir -p "$tmp/hand"
    hand_cmd=""
    for ((r = 0; r < world; r++)); do
      local env=(env "${rank_env[@]}")
      case $gpu_of in
        each) env+=(CUDA_VISIBLE_DEVICES="$(gpu_id "$r")") ;;
        same) env+=(CUDA_VISIBLE_DEVICES="$(gpu_id 0)") ;;
        # Nodes of one GPU each on this one GPU: a host of its own to the workbook and to
        # NCCL (bench/gpu-nodes.sh), over loopback.
        nodes) env+=(SLURMD_NODENAME="node-$r" NCCL_HOSTID="node-$r" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
          NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}") ;;
      esac
      local args=("$bins/$ex" --backend nccl --world-size "$world" --rank "$r"
        --master-addr 127.0.0.1 --master-port "$port" --timeout "$rank_timeout" "$@")
      hand_cmd+="$(cmdline "${env[@]:1}" "${args[@]}") &"$'\n'
      "${env[@]}" "${args[@]}" >"$tmp/hand/rank$r.out" 2>"$tmp/hand/rank$r.err" </dev/null &
      pids+=($!)
    done
  }
  # wait_ranks LIMIT [RANK...]: waits at most LIMIT seconds for those ranks (default: all)
  # to end; sets codes[R] (exit status, '-' while running) and ended_at[R] ($SECONDS).
  wait_ranks() {
    local limit=$1 t0=$SECONDS r
    shift
    local which=("$@")
    [ ${#which[@]} -gt 0 ] || which=("${!pids[@]}")
    while :; do
      local running=0
      for r in "${which[@]}"; do
        [ "${codes[$r]:--}" != - ] && continue
        if ended "${pids[$r]}"; then
          wait "${pids[$r]}" 2>/dev/null
          codes[r]=$?
          ended_at[r]=$SECONDS
        else
          codes[r]=-
          running=$((running + 1))
        fi
      done
      [ "$running" = 0 ] && break
      [ $((SECONDS - t0)) -ge "$limit" ] && break
      sleep 0.2
    done
  }
  # The ranks' outputs, for the report: one file.
  hand_logs() {
    local r f=$tmp/hand/all.log
    : >"$f"
    for r in "${!pids[@]}"; do
      { echo "--- rank $r (exit ${codes[$r]:-?}) stdout"; cat "$tmp/hand/rank$r.out"
        echo "--- rank $r stderr"; grep -v 'NCCL INFO' "$tmp/hand/rank$r.err"; } >>"$f"
    done
    echo "$f"
  }
  # What a rank said, without NCCL's own INFO/WARN lines.
  said() { grep -v -E 'NCCL (INFO|WARN)' "$tmp/hand/rank$1.err"; }
  # hand_step NAME LIMIT LOG EXAMPLE ARGS...: run_step's work for ranks started by hand, one
  # per GPU (MIG: one per MIG device, each its own CUDA_VISIBLE_DEVICES): every rank's
  # output in LOG; rc is the first rank's failure (or 0), ranks still running after LIMIT
  # seconds are killed (timed_out).
  hand_step() {
    local name=$1 limit=$2 log=$3 ex=$4 r
    shift 4
    local t0=$SECONDS
    say "running: $name ($ex, $gpus ranks started by hand, each its own CUDA_VISIBLE_DEVICES)"
    start_ranks "$ex" "$gpus" "$spread" "$@"
    cmd=$hand_cmd
    wait_ranks "$limit"
    secs=$((SECONDS - t0))
    rc=0 timed_out=false
    for r in "${!pids[@]}"; do
      if [ "${codes[$r]}" = - ]; then
        timed_out=true
        kill -CONT "${pids[$r]}" 2>/dev/null
        kill -9 "${pids[$r]}" 2>/dev/null
      elif [ "$rc" = 0 ] && [ "${codes[$r]}" != 0 ]; then
        rc=${codes[$r]}
      fi
    done
    $timed_out && { rc=124; wait_ranks 5; }
    cp "$(hand_logs)" "$log"
  }
  # How the multi-rank steps spread their ranks: as the user's launcher would (every rank
  # sees every GPU, and takes GPU rank % count), or, on MIG devices, one device each.
  spread=all
  $mig && spread=each

  exec 2>>"$tmp/bash-notes.log" # "line N: PID Killed ...": bash on the ranks it saw killed

  # -------------------------------------------------------------------------------------
  # 4. Every lesson on NCCL, one rank per GPU.
  hold="all $gpus ranks hold"
  [ "$gpus" = 1 ] && hold="the one rank holds"
  for ex in "${examples[@]}"; do
    log=$tmp/$ex.log
    more=()
    # The benchmark: every collective, operator and type, checked, at a few sizes.
    [ "$ex" = 07-nccl-perf ] && more=(--coll all -o all -d all -b 4 -e 16M -f 64)
    if $mig; then
      hand_step "$ex" 600 "$log" "$ex" "${more[@]}"
    else
      run_step "$ex" 600 "$log" "$bins/$ex" --backend nccl --nproc-per-node "$gpus" --timeout 60 "${more[@]}"
    fi
    case $ex in
      00-nccl-hello-world) want="^Hello from $gpus rank$([ "$gpus" = 1 ] || echo s):" ;;
      01-nccl-broadcast) want="^Check: OK, $hold 42 " ;;
      02-nccl-allreduce) want="^Check: OK, $hold $gpus " ;;
      0[3-6]-*) want="^Check: OK, $hold the expected values" ;;
      07-nccl-perf) want="^# Out of bounds values : 0 OK" ;;
      08-cudarc-allreduce) want="^rank 0: sent 1, got \\[$((gpus * (gpus + 1) / 2))\\.0" ;;
      *) want="^Check: OK, $hold " ;; # a lesson with no case of its own
    esac
    if $timed_out; then
      record "$ex" FAIL "did not end within 600 s" "$secs" "$cmd" "$log"
    elif [ "$rc" != 0 ]; then
      record "$ex" FAIL "exit $rc: $(grep -m 1 '^error:' "$log")" "$secs" "$cmd" "$log"
    elif ! grep -q '^backend: nccl' "$log"; then
      record "$ex" FAIL "not on NCCL: $(grep -m 1 '^backend:' "$log")" "$secs" "$cmd" "$log"
    elif ! grep -q "$want" "$log"; then
      record "$ex" FAIL "no line '${want#^}' in its output" "$secs" "$cmd" "$log"
    else
      record "$ex" PASS "$(grep -m 1 -E '^(Check|Hello|# Avg bus bandwidth|rank 0: sent)' "$log")" "$secs" "$cmd" "$log"
    fi
    left=$(reap_leftovers) || record "$ex: leftovers" FAIL "left running (killed now): ${left%; }" 0 ""
  done

  # The calls the NCCL backend makes, shown (--show-calls): every rank's ncclAllReduce.
  log=$tmp/show-calls.log
  if $mig; then
    hand_step "--show-calls" 120 "$log" 02-nccl-allreduce --show-calls --count 1024 --iters 1
  else
    run_step "--show-calls" 120 "$log" "$bins/02-nccl-allreduce" --backend nccl --nproc-per-node "$gpus" \
      --timeout 60 --show-calls --count 1024 --iters 1
  fi
  shown=$(grep -c '│ ncclAllReduce(.*count=1024, datatype=ncclFloat32, op=ncclSum' "$log")
  if [ "$rc" != 0 ]; then
    record "--show-calls" FAIL "exit $rc: $(grep -m 1 '^error:' "$log")" "$secs" "$cmd" "$log"
  elif [ "$shown" != $((3 * gpus)) ]; then
    record "--show-calls" FAIL "$shown ncclAllReduce lines shown, $((3 * gpus)) expected (per rank: one checked, the timed loop's warm-up and one timed)" "$secs" "$cmd" "$log"
  elif [ "$(grep -c '│ ncclCommSplit(' "$log")" != "$gpus" ]; then
    record "--show-calls" FAIL "no ncclCommSplit on every rank: the timed loop's blocking communicator is missing" "$secs" "$cmd" "$log"
  else
    record "--show-calls" PASS "$(grep -m 1 '│ ncclAllReduce(' "$log")" "$secs" "$cmd" "$log"
  fi

  # -A and -P on NCCL: each value a communicator split after the variable changed, and
  # NCCL's own choice (its TUNING lines) following it (one rank tunes nothing).
  log=$tmp/per-sweep.log
  if $mig; then
    record "-A/-P per sweep" SKIP "MIG devices: started by hand, one rank per device; the step needs the launcher" 0 ""
  elif [ "$gpus" -lt 2 ]; then
    record "-A/-P per sweep" SKIP "one GPU: NCCL tunes nothing on one rank (ncclTopoTuneModel returns before NCCL_ALGO); the 4 nodes of one GPU each run it (bench/gpu-nodes.sh, perf-per-sweep)" 0 ""
  else
    # On the double, a version that prints its choices (2.18, its default, prints none).
    played=()
    [ "$on_double" = 1 ] && played=(env "NCCL_DOUBLE_VERSION=${NCCL_DOUBLE_VERSION:-22803}")
    run_step "-A/-P per sweep" 300 "$log" "${played[@]}" "$bins/07-nccl-perf" --backend nccl \
      --nproc-per-node "$gpus" --timeout 60 -b 8 -e 1M -f 32 -n 5 -w 2 -A ring,tree -P ll,simple
    read -r followed rows unknown < <(per_sweep_rows "$log")
    if [ "$rc" != 0 ]; then
      record "-A/-P per sweep" FAIL "exit $rc: $(grep -m 1 '^error:' "$log")" "$secs" "$cmd" "$log"
    elif [ "$rows" = 0 ] || [ $((followed + unknown)) != "$rows" ]; then
      record "-A/-P per sweep" FAIL "$followed of $rows rows ran what their sweep's -A and -P asked (the algo proto column)" "$secs" "$cmd" "$log"
    elif [ "$unknown" = "$rows" ]; then
      record "-A/-P per sweep" PASS "$rows rows in 4 sweeps; NCCL printed no choice here (2.18 and 2.19 print none), so the column cannot say what ran" "$secs" "$cmd" "$log"
    else
      record "-A/-P per sweep" PASS "$followed of $rows rows ran what their sweep's NCCL_ALGO and NCCL_PROTO asked, by NCCL's own lines" "$secs" "$cmd" "$log"
    fi
  fi

  # -------------------------------------------------------------------------------------
  # 5. The exercises' checker on NCCL (it builds the exercises itself: needs cargo).
  max_world=$((gpus > 5 ? 5 : gpus))
  if ! $have_cargo; then
    record "exercises' checker" SKIP "no cargo here (cargo workbook check builds the exercises)" 0 ""
  elif [ -n "$build_offline" ]; then
    record "exercises' checker" SKIP "it builds the exercises, and the build could not reach crates.io (see the build step)" 0 ""
  elif $mig; then
    record "exercises' checker" SKIP "MIG devices: the checker starts its ranks with one CUDA_VISIBLE_DEVICES for all, so every rank would see the same (first) MIG device" 0 ""
  elif [ "$gpus" -lt 2 ]; then
    record "exercises' checker" SKIP "one GPU: its cases need at least 2 ranks, each on its own GPU" 0 ""
  else
    log=$tmp/workbook-check.log
    run_step "exercises' checker" 3600 "$log" cargo workbook check --all --solution --backend nccl --max-world "$max_world"
    summary=$(grep -E '^[0-9]+ of [0-9]+ exercises pass' "$log" | tail -n 1)
    if [ "$rc" = 0 ]; then
      record "exercises' checker" PASS "$summary" "$secs" "$cmd" "$log"
    elif no_network "$log"; then
      record "exercises' checker" FAIL "exit $rc: cargo could not download the crates from crates.io to build the exercises: \
no network here, as often on compute nodes. What to do: $offline_advice" "$secs" "$cmd" "$log"
    else
      record "exercises' checker" FAIL "exit $rc${summary:+: $summary}" "$secs" "$cmd" "$log"
    fi
    left=$(reap_leftovers) || record "exercises' checker: leftovers" FAIL "left running (killed now): ${left%; }" 0 ""
  fi

  # -------------------------------------------------------------------------------------
  # 6. The perf sweep, with NCCL's own account of what it chose.
  log=$tmp/perf.log
  # Meanwhile, which libnccl file the ranks have mapped (/proc/PID/maps: the real file, not
  # the name it was loaded by).
  (
    for _ in $(seq 3600); do
      for p in $(ours); do grep -o '/[^ ]*libnccl[^ ]*' "/proc/$p/maps" 2>/dev/null; done | sort -u >"$tmp/maps.txt"
      [ -s "$tmp/maps.txt" ] && break
      sleep 0.5
    done
  ) &
  sampler=$!
  [ "$on_double" = 1 ] && [ "$perf_max" = 256M ] && perf_max=1M # the double copies through files: slow
  if $mig; then
    rank_env=(NCCL_DEBUG=INFO)
    hand_step "07-nccl-perf sweep" 1800 "$log" 07-nccl-perf -b 8 -e "$perf_max" -f 2
    rank_env=()
  else
    run_step "07-nccl-perf sweep" 1800 "$log" env NCCL_DEBUG=INFO "$bins/07-nccl-perf" --backend nccl \
      --nproc-per-node "$gpus" -b 8 -e "$perf_max" -f 2 --timeout 60
  fi
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  nccl_mapped=$(sort -u "$tmp/maps.txt" 2>/dev/null | tr '\n' ' ')
  perf_table=$(grep -E '^#|^ +[0-9]' "$log" | grep -v 'NCCL INFO')
  nccl_info=$(grep -E 'NCCL (INFO|WARN)' "$log" | head -n 200)
  nccl_version_info=$(grep -m 1 -o 'NCCL version .*' "$log")
  if $timed_out; then
    record "07-nccl-perf sweep" FAIL "did not end within 1800 s" "$secs" "$cmd" "$log"
  elif [ "$rc" != 0 ]; then
    record "07-nccl-perf sweep" FAIL "exit $rc: $(grep -m 1 '^error:' "$log")" "$secs" "$cmd"
  elif ! grep -q '^# Out of bounds values : 0 OK' "$log"; then
    record "07-nccl-perf sweep" FAIL "wrong values in the sweep (see the table)" "$secs" "$cmd"
  else
    record "07-nccl-perf sweep" PASS "$(grep -m 1 '^# Avg bus bandwidth' "$log")" "$secs" "$cmd"
  fi
  left=$(reap_leftovers) || record "perf: leftovers" FAIL "left running (killed now): ${left%; }" 0 ""

  # -------------------------------------------------------------------------------------
  # 6a. nccl-tests' all_reduce_perf on the same GPUs and sizes: its busbw beside ours. The
  #     workbook's timed loop is nccl-tests' own (a blocking communicator, the calls back
  #     to back, one wait): within 5% at every size is the goal. nccl-tests runs as one
  #     process driving every GPU (-g), the workbook one process per GPU.
  name="07-nccl-perf against nccl-tests"
  art=""
  if [ -n "$nccl_tests" ] && [ -d "$nccl_tests" ]; then
    for f in "$nccl_tests/build/all_reduce_perf" "$nccl_tests/all_reduce_perf"; do [ -x "$f" ] && { art=$f; break; }; done
  elif [ -n "$nccl_tests" ]; then
    [ -x "$nccl_tests" ] && art=$nccl_tests
  else
    art=$(command -v all_reduce_perf 2>/dev/null || true)
  fi
  compare_table="" retake_table=""
  bw_name=busbw bw_out=8 bw_in=12
  [ "$gpus" = 1 ] && bw_name=algbw bw_out=7 bw_in=11
  if [ "$on_double" = 1 ] && [ -z "$nccl_tests" ]; then
    record "$name" SKIP "the NCCL test double is not a GPU: nothing to compare (with --nccl-tests, its plumbing is tested)" 0 ""
  elif $mig; then
    record "$name" SKIP "MIG devices: all_reduce_perf -g drives several GPUs from one process, which sees one MIG device" 0 ""
  elif [ -z "$art" ]; then
    record "$name" SKIP "no all_reduce_perf (--nccl-tests, NCCL_TESTS, or on PATH${nccl_tests:+: $nccl_tests has none}); build nccl-tests on the login node (see --help)" 0 ""
  elif [ ! -s "$log" ] || ! grep -q '^# Out of bounds values : 0 OK' "$log"; then
    record "$name" SKIP "the perf sweep did not pass: nothing to compare" 0 ""
  else
    tlog=$tmp/nccl-tests.log
    # The same NCCL as the workbook's ranks: the libnccl file they mapped, preloaded (the
    # libnccl.so.2 all_reduce_perf asks for is then that one, whatever its search path
    # finds), and NCCL's version line (NCCL_DEBUG=VERSION) to show it.
    theirs=(env NCCL_DEBUG=VERSION)
    same_lib="the ranks' libnccl file was not seen: no LD_PRELOAD"
    read -r -a mapped_files <<<"$nccl_mapped"
    if [ ${#mapped_files[@]} = 1 ]; then
      theirs+=("LD_PRELOAD=${mapped_files[0]}${LD_PRELOAD:+:$LD_PRELOAD}")
      same_lib="LD_PRELOAD=${mapped_files[0]}"
    elif [ ${#mapped_files[@]} -gt 1 ]; then
      same_lib="the ranks mapped ${#mapped_files[@]} libnccl files: no LD_PRELOAD"
    fi
    run_step "$name" 1800 "$tlog" "${theirs[@]}" "$art" -b 8 -e "$perf_max" -f 2 -g "$gpus" -n 20 -w 5
    # X.Y.Z of NCCL's "NCCL version 2.29.7+cuda12.9", else of nccl-tests' nccl-library=22907.
    dotted() { sed -nE 's/.*NCCL version ([0-9]+\.[0-9]+\.[0-9]+).*/\1/p; s/.*nccl-library=([0-9]+)([0-9]{2})([0-9]{2}).*/\1.\2.\3/p' |
      head -n 1 | sed -E 's/\.0([0-9])/.\1/g'; }
    ours_v=$(dotted <<<"${nccl_version_info:-NCCL version $nccl_version}")
    theirs_v=$(dotted <"$tlog")
    if $timed_out; then
      record "$name" FAIL "all_reduce_perf did not end within 1800 s" "$secs" "$cmd" "$tlog"
    elif [ "$rc" != 0 ]; then
      record "$name" FAIL "all_reduce_perf: exit $rc" "$secs" "$cmd" "$tlog"
    elif [ -z "$theirs_v" ]; then
      record "$name" FAIL "all_reduce_perf printed no NCCL version (NCCL_DEBUG=VERSION) and no nccl-library=: \
nothing says it ran the workbook's NCCL (${ours_v:-unknown}; $same_lib)" "$secs" "$cmd" "$tlog"
    elif [ "$theirs_v" != "$ours_v" ]; then
      record "$name" FAIL "not the same NCCL: all_reduce_perf ran NCCL $theirs_v, the workbook's ranks ${ours_v:-an unknown one} \
($same_lib): two libraries, not two programs, would be compared" "$secs" "$cmd" "$tlog"
    else
      # size, then busbw out of place (column 8) and in place (column 12), of both tables;
      # with one rank busbw is 0 by definition (n-1 of n), so algbw (columns 7 and 11).
      rows() { awk -v o="$bw_out" -v i="$bw_in" '$1 ~ /^[0-9]+$/ && NF >= 12 { print $1, $o, $i }' "$1"; }
      compare_table=$(join <(rows "$tlog" | sort -k1,1) <(rows "$log" | sort -k1,1) | sort -n -k1,1 |
        awk '{ r1 = ($2 > 0 ? $4 / $2 : 0); r2 = ($3 > 0 ? $5 / $3 : 0)
               printf "| %s | %s | %s | %.2f | %s | %s | %.2f |\n", $1, $2, $4, r1, $3, $5, r2 }')
      # Judged: every size, both columns; on one GPU, out of place from 32 MiB only. One
      # rank's all-reduce in place copies nothing (its buffer is already the result) and,
      # out of place, is one copy on the GPU whose time below 32 MiB is the launch's, a
      # few microseconds, where two programs differ by 30% from run to run (2026-11-26,
      # an H200). The table shows every size all the same.
      judged=$(awk -F' *[|] *' -v one=$((gpus == 1)) '!one || $2 + 0 >= 33554432' <<<"$compare_table")
      below=$(awk -F' *[|] *' -v one=$((gpus == 1)) '$5 + 0 < 0.95 || (!one && $8 + 0 < 0.95) { printf "%s%s", sep, $2; sep = ", " }' <<<"$judged")
      n=$(grep -c . <<<"$judged")
      sizes="all $n sizes"
      [ "$gpus" = 1 ] && sizes="the $n sizes of 32 MiB and up, out of place (one GPU: in place NCCL copies nothing, and below 32 MiB a call's time is its launch's; the table shows them, unjudged)"
      if [ "$n" = 0 ]; then
        record "$name" FAIL "no size to judge in common between the two tables" "$secs" "$cmd" "$tlog"
      elif [ -n "$below" ]; then
        # A retake, to tell noise from a cost: the sizes found below, both programs three
        # times in turn with 5 times the iterations, each side's median. One take of 20
        # calls of 20 us is 0.4 ms of GPU time: one hiccup moves it 20% (2026-11-26, an
        # H200: 0.83 at 32 MiB, 1.00 at every size above it). A cost shows in both takes.
        lo=${below%%,*} hi=${below##* }
        retake_log=$tmp/retake.log
        : >"$retake_log"
        for round in 1 2 3; do
          timeout -k 10 600 "${theirs[@]}" "$art" -b "$lo" -e "$hi" -f 2 -g "$gpus" -n 100 -w 20 >"$tmp/retake-theirs-$round.log" 2>&1 </dev/null
          timeout -k 10 600 "$bins/07-nccl-perf" --backend nccl --nproc-per-node "$gpus" -b "$lo" -e "$hi" -f 2 -n 100 -w 20 \
            --timeout 60 >"$tmp/retake-ours-$round.log" 2>&1 </dev/null
          cat "$tmp/retake-theirs-$round.log" "$tmp/retake-ours-$round.log" >>"$retake_log"
        done
        # The median over the three rounds of each side, size by size.
        median_rows() { for f in "$@"; do rows "$f"; done | sort -k1,1n -k2,2g | awk '
          { n[$1]++; v[$1, n[$1]] = $2 } END { for (k in n) print k, v[k, int((n[k] + 1) / 2)] }' | sort -k1,1; }
        retake_table=$(join <(median_rows "$tmp"/retake-theirs-*.log) <(median_rows "$tmp"/retake-ours-*.log) |
          sort -n -k1,1 | awk '$1 >= '"$lo"' && $1 <= '"$hi"' { printf "| %s | %s | %s | %.2f |\n", $1, $2, $3, ($2 > 0 ? $3 / $2 : 0) }')
        still=$(awk -F' *[|] *' '$5 + 0 < 0.95 { printf "%s%s", sep, $2; sep = ", " }' <<<"$retake_table")
        if [ -z "$retake_table" ]; then
          record "$name" FAIL "$bw_name below 95% of nccl-tests' at $below B (judged: $sizes), and the retake gave no table" "$secs" "$cmd" "$tlog" "$retake_log"
        elif [ -n "$still" ]; then
          record "$name" FAIL "$bw_name below 95% of nccl-tests' at $below B (judged: $sizes), and again at $still B in a retake (3 rounds each, -n 100, medians): a cost, not noise" "$secs" "$cmd" "$tlog" "$retake_log"
        else
          record "$name" PASS "$bw_name within 5% of nccl-tests' (or above) at $sizes, after a retake of $below B (below 95% in the first take: 3 rounds each, -n 100, medians; both tables in the report); both on NCCL $ours_v ($same_lib)" "$secs" "$cmd" "$tlog" "$retake_log"
        fi
      else
        record "$name" PASS "$bw_name within 5% of nccl-tests' (or above) at $sizes; both on NCCL $ours_v ($same_lib)" "$secs" "$cmd" "$tlog"
      fi
    fi
  fi

  # -------------------------------------------------------------------------------------
  # 6b. One all-reduce with NCCL's account of its set-up: the topology, the rings and trees
  #     (GRAPH), the tuning table (TUNING). Each rank's NCCL lines are kept apart, bounded.
  name="NCCL_DEBUG=INFO all-reduce"
  debug_size=64M
  [ "$on_double" = 1 ] && debug_size=1M # the double copies through files: slow
  debug_dir=$tmp/nccl-debug
  mkdir -p "$debug_dir"
  rank_env=(NCCL_DEBUG=INFO "NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING")
  t0=$SECONDS
  start_ranks 02-nccl-allreduce "$gpus" "$spread" --size "$debug_size"
  rank_env=()
  say "running: $name ($gpus ranks started by hand, --size $debug_size)"
  wait_ranks 300
  secs=$((SECONDS - t0))
  why="" debug_lines=0
  for r in "${!pids[@]}"; do
    if [ "${codes[$r]}" = - ]; then why+="rank $r still running after 300 s; "
    elif [ "${codes[$r]}" != 0 ]; then why+="rank $r: exit ${codes[$r]} $(said "$r" | grep -m 1 '^error:'); "
    fi
    # NCCL prints to stdout (unless NCCL_DEBUG_FILE): both streams, in the order of each.
    cat "$tmp/hand/rank$r.out" "$tmp/hand/rank$r.err" | grep -E 'NCCL (INFO|WARN)' >"$debug_dir/rank$r.log"
    debug_lines=$((debug_lines + $(wc -l <"$debug_dir/rank$r.log")))
  done
  grep -q "^Check: OK" "$tmp/hand/rank0.out" || why+="no 'Check: OK' from rank 0; "
  logf=$(hand_logs)
  left=$(reap_leftovers) || why+="left running (killed now): ${left%; }; "
  debug_cmd=$hand_cmd
  if [ "$debug_lines" = 0 ] && [ "$on_double" = 1 ]; then
    debug_note="The NCCL test double (GPU_CHECK_ON_DOUBLE=1) prints no NCCL_DEBUG lines: there are no rings, trees or tuning table to show. On a GPU node, NCCL's own lines are here."
  elif [ "$debug_lines" = 0 ]; then
    why+="NCCL printed no INFO line with NCCL_DEBUG=INFO; "
    debug_note="NCCL printed no INFO line, though NCCL_DEBUG=INFO was set (and NCCL_DEBUG_FILE unset)."
  fi
  if [ -z "$why" ]; then
    if [ "$debug_lines" = 0 ]; then debug_said="no NCCL lines: the test double prints none"
    else debug_said="$debug_lines lines of NCCL's, in the section \"NCCL's account of one all-reduce\""; fi
    record "$name" PASS "$(grep -m 1 '^Check:' "$tmp/hand/rank0.out"); $debug_said" "$secs" "$hand_cmd" "$logf"
  else
    record "$name" FAIL "${why%; }" "$secs" "$hand_cmd" "$logf"
  fi

  # -------------------------------------------------------------------------------------
  # 7. Two ranks on one GPU: refused. By the workbook (its ranks compare their GPUs, as
  #    NCCL does: exit 2 and one line naming the GPU), or, where the GPU is in
  #    EXCLUSIVE_PROCESS compute mode, by the driver before that (the second process to
  #    open the GPU gets CUDA_ERROR_DEVICE_UNAVAILABLE, the other rank ends by --timeout).
  name="two ranks on one GPU refused"
  gpu0=$(gpu_id 0)
  mode=""
  if [ "$on_double" = 1 ] && [ -z "$compute_modes" ]; then
    mode_said="the NCCL test double has no compute mode"
  elif [ -z "$compute_modes" ]; then
    mode_said="its compute mode unknown: no answer from nvidia-smi --query-gpu=compute_mode"
  else
    mode=$(mode_of "$gpu0")
    what="GPU $gpu0"
    [[ $gpu0 == MIG-* ]] && what="the GPU of MIG device $gpu0"
    mode_said="$what is in compute mode $mode"
    [ -n "$mode" ] || mode_said="$what: compute mode unknown (not in nvidia-smi's list)"
    [ "$on_double" = 1 ] && mode_said+=" (played: GPU_CHECK_DOUBLE_COMPUTE_MODE, which the double does not enforce)"
  fi
  # The steps that put several processes on one GPU (on one GPU: the 4 nodes of one GPU
  # each, the kill and stop cases): EXCLUSIVE_PROCESS lets one process open a GPU, unless
  # an MPS server shares it (to the driver, its clients are one process).
  if [ "$mode" = Exclusive_Process ]; then
    if mps=$(mps_running); then
      shared_gpu_note="$what is in compute mode $mode, shared through MPS: $mps"
    else
      shared_gpu_why="$what is in compute mode $mode (one process per GPU) and no MPS server runs (no nvidia-cuda-mps-control, no \
${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control): the driver would refuse every process on it but the first; \
run this with MPS (nvidia-cuda-mps-control -d) or on a GPU in compute mode Default"
    fi
  fi
  t0=$SECONDS
  start_ranks 00-nccl-hello-world 2 same
  wait_ranks $((rank_timeout + grace))
  secs=$((SECONDS - t0))
  why="" how=""
  busy='CUDA_ERROR_DEVICE_UNAVAILABLE|CUDA_ERROR_DEVICE_BUSY|DEVICES_UNAVAILABLE|busy or unavailable'
  for r in 0 1; do
    if [ "${codes[$r]}" = - ]; then why+="rank $r still running after $((rank_timeout + grace)) s; "
    elif [ "${codes[$r]}" = 0 ]; then why+="rank $r exited 0: nothing refused the second rank on GPU $gpu0; "
    elif said "$r" | grep -qE 'internal error \(a bug in the workbook|panicked'; then
      why+="rank $r panicked: $(said "$r" | grep -m 1 -E 'internal error|panicked'); "
    fi
  done
  refused_by_driver=""
  for r in 0 1; do said "$r" | grep -qE "$busy" && refused_by_driver+="$r "; done
  if [ -n "$why" ]; then
    :
  elif [ -z "$refused_by_driver" ]; then
    # The workbook's refusal: exit 2 and one line naming the GPU, on both ranks.
    for r in 0 1; do
      lines=$(said "$r")
      if [ "${codes[$r]}" != 2 ]; then why+="rank $r exited ${codes[$r]}, not 2; "
      elif [ "$(grep -c . <<<"$lines")" != 1 ]; then why+="rank $r said $(grep -c . <<<"$lines") lines, not one; "
      elif ! grep -qE '^error: .*GPU' <<<"$lines" || ! grep -qiE 'duplicate|same|both|twice|already' <<<"$lines"; then
        why+="rank $r's error does not name the shared GPU: $lines; "
      fi
    done
    case $mode in
      Exclusive_Process) how="the workbook refused them, though $mode_said: the driver let both processes open it (an MPS server shares it?), and the ranks, comparing their GPUs' UUIDs as NCCL does, refused the duplicate" ;;
      "") how="the workbook refused them ($mode_said): the ranks compared their GPUs (UUID) and hosts (NCCL_HOSTID, else the machine), as NCCL does, and refused the duplicate" ;;
      *) how="the workbook refused them ($mode_said, which lets several processes share a GPU: the ranks compared their GPUs (UUID) and hosts (NCCL_HOSTID, else the machine), as NCCL does, and refused the duplicate)" ;;
    esac
    how+="; exit 2 on both; rank 0 said: $(said 0)"
  else
    # The driver's refusal: one rank could not open the GPU, the other ended without it.
    r=${refused_by_driver%% *} other=$((1 - ${refused_by_driver%% *}))
    case $mode in
      Exclusive_Process) how="the driver refused rank $r ($mode_said: one process per GPU, so the second process to open it fails, before the ranks can compare their GPUs)" ;;
      "") how="the driver refused rank $r ($mode_said; CUDA's error says the device is busy or unavailable: EXCLUSIVE_PROCESS, most likely)" ;;
      *)
        how="the driver refused rank $r"
        why="the driver refused rank $r as busy, though $mode_said, not Exclusive_Process: does another process hold it? (nvidia-smi lists the GPU's processes); "
        ;;
    esac
    said "$r" | grep -qE "^error: .*($busy)" || why+="rank $r's error is not one 'error:' line: $(said "$r" | grep -m 1 -E "$busy"); "
    how+=": rank $r exited ${codes[$r]}: $(said "$r" | grep -m 1 -E "$busy"); rank $other exited ${codes[$other]}: $(said "$other" | grep -m 1 '^error:')"
  fi
  logf=$(hand_logs)
  left=$(reap_leftovers) || why+="left running (killed now): ${left%; }; "
  if [ -z "$why" ]; then
    record "$name" PASS "$how" "$secs" "$hand_cmd" "$logf"
  else
    record "$name" FAIL "${why%; }${how:+ ($how)}" "$secs" "$hand_cmd" "$logf"
  fi

  if [ "$gpus" -ge 2 ]; then
    # -----------------------------------------------------------------------------------
    # 8. Ranks each given their own GPU (Slurm's per-task binding), started by hand.
    # NCCL's INIT lines in files of their own (the transports, for 8a), out of the ranks' output.
    name="ranks each on their own GPU (CUDA_VISIBLE_DEVICES=i)"
    mkdir -p "$tmp/transport-each"
    rank_env=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "NCCL_DEBUG_FILE=$tmp/transport-each/nccl.%p.log")
    t0=$SECONDS
    start_ranks 02-nccl-allreduce "$gpus" each
    rank_env=()
    wait_ranks 120
    secs=$((SECONDS - t0))
    logf=$(hand_logs)
    why=""
    for r in "${!pids[@]}"; do
      [ "${codes[$r]}" = 0 ] || why+="rank $r: exit ${codes[$r]} $(said "$r" | grep -m 1 '^error:'); "
    done
    grep -q "^Check: OK, all $gpus ranks hold $gpus " "$tmp/hand/rank0.out" || why+="no 'Check: OK' from rank 0; "
    left=$(reap_leftovers) || why+="left running (killed now): ${left%; }; "
    if [ -z "$why" ]; then
      record "$name" PASS "$(grep -m 1 '^Check:' "$tmp/hand/rank0.out")" "$secs" "$hand_cmd" "$logf"
    else
      record "$name" FAIL "${why%; }" "$secs" "$hand_cmd" "$logf"
    fi

    # -----------------------------------------------------------------------------------
    # 8a. How NCCL connected this node's GPUs, by its own lines in the steps above (the perf
    #     sweep, the NCCL_DEBUG=INFO all-reduce, step 8): "Channel 00/0 : 0[0] -> 1[1] via
    #     P2P/IPC" is NVLink or PCIe, GPU to GPU; SHM (through host memory) or NET between
    #     GPUs of one node is what NCCL falls back to when a process cannot reach its peer's
    #     GPU (Slurm's --gpus-per-task with ConstrainDevices=yes: NVIDIA/nccl#1066), or when
    #     NCCL_P2P_DISABLE=1: busbw collapses. A WARN, not a failure: the workbook is right.
    name="NCCL's transport between this node's GPUs"
    if $mig; then
      record "$name" SKIP "MIG devices: CUDA gives MIG devices no peer access, so NCCL connects them through host memory (SHM) by design" 0 ""
    else
      seen="" fell="" example=""
      for src in perf debug each; do
        case $src in
          perf) label="the perf sweep" files=("$tmp/perf.log") ;;
          debug) label="the NCCL_DEBUG=INFO all-reduce" files=("$debug_dir"/rank*.log) ;;
          each) label="ranks each on their own GPU" files=("$tmp/transport-each"/*) ;;
        esac
        lines=$(cat "${files[@]}" 2>/dev/null | grep -E 'NCCL INFO Channel [0-9]+(/[0-9]+)? : [0-9]+\[[0-9a-f]+\] -> [0-9]+\[[0-9a-f]+\]( \[(send|receive)\])? via ')
        [ -n "$lines" ] || continue
        # Each transport (its first two words: P2P/IPC, SHM/direct, NET/IB...), counted.
        counted=$(sed -E 's/.* via ([^/ ]+(\/[^/ ]+)?).*/\1/' <<<"$lines" | sort | uniq -c |
          awk '{printf "%s%s x %s", sep, $1, $2; sep = ", "}')
        seen+="${seen:+; }$label: $counted"
        if other=$(grep -m 1 -E ' via (SHM|NET)' <<<"$lines"); then
          fell+="${fell:+, }$label"
          [ -n "$example" ] || example=${other#*NCCL INFO }
        fi
      done
      p2p_off=""
      [ -n "${NCCL_P2P_DISABLE:-}" ] && p2p_off=" (NCCL_P2P_DISABLE=$NCCL_P2P_DISABLE is set here)"
      if [ -z "$seen" ]; then
        record "$name" SKIP "NCCL printed no transport line ('Channel ... via ...', NCCL_DEBUG=INFO) in the perf sweep, the all-reduce or step 8" 0 ""
      elif [ -n "$fell" ]; then
        via=${example##* via }
        record "$name" WARN "via ${via%%/*} between GPUs of one node: see docs/nccl-backend.md (\"One GPU per task\"): not P2P (NVLink or PCIe), so busbw is far below the link's$p2p_off. In $fell: \`$example\`. All: $seen" 0 ""
      else
        record "$name" PASS "P2P (NVLink or PCIe) between every two GPUs NCCL connected: $seen" 0 ""
      fi
    fi
  else
    record "ranks each on their own GPU" SKIP "$one_gpu_why" 0 ""
    record "NCCL's transport between this node's GPUs" SKIP "$one_gpu_why" 0 ""
  fi

  # -------------------------------------------------------------------------------------
  # 9. A rank killed, then one stopped, during a large all-reduce: one rank per GPU; on
  #    one GPU (not MIG), 4 ranks as nodes of one GPU each (NCCL_HOSTID), which NCCL
  #    connects over loopback sockets.
  fail_world=$gpus fail_spread=$spread big=1G
  if [ "$gpus" = 1 ] && ! $mig; then fail_world=4 fail_spread=nodes big=64M; fi
  [ "$on_double" = 1 ] && big=16M # the double copies through files: slow
  if [ "$fail_spread" = nodes ] && [ -n "$shared_gpu_why" ]; then
    record "a rank killed or stopped (4 nodes of one GPU each)" SKIP "$shared_gpu_why" 0 ""
  elif [ "$fail_world" -ge 2 ]; then
    victim=$((fail_world - 1))
    as=""
    [ "$fail_spread" = nodes ] && as=" (4 nodes of one GPU each${shared_gpu_note:+, through MPS})"
    for sig in KILL STOP; do
      name="kill -$sig rank $victim during an all-reduce$as"
      t0=$SECONDS
      start_ranks 02-nccl-allreduce "$fail_world" "$fail_spread" --size "$big" --iters 100000
      why=""
      # Into the timed loop: rank 0 has printed its check (then the iterations begin).
      started=false
      for _ in $(seq 600); do
        grep -q '^Check: OK' "$tmp/hand/rank0.out" && { started=true; break; }
        for r in "${!pids[@]}"; do ended "${pids[$r]}" && break 2; done
        sleep 0.2
      done
      if ! $started; then
        why="the all-reduce did not get going (no 'Check: OK' from rank 0 within 120 s, or a rank ended): nothing to test"
        kill -9 "${pids[@]}" 2>/dev/null
        wait_ranks 5
      else
        sleep 2
        if ended "${pids[$victim]}"; then why="rank $victim had already ended before the signal; "; fi
        kill -"$sig" "${pids[$victim]}" 2>/dev/null
        t_sig=$SECONDS
        # Everyone else must end by --timeout and a few seconds.
        others=()
        for r in "${!pids[@]}"; do [ "$r" = "$victim" ] || others+=("$r"); done
        wait_ranks $((rank_timeout + grace)) "${others[@]}"
        slowest=0
        for r in "${others[@]}"; do
          if [ "${codes[$r]}" = - ]; then
            why+="rank $r still running $((SECONDS - t_sig)) s after the signal; "
          else
            [ "${codes[$r]}" = 0 ] && why+="rank $r exited 0 though rank $victim was gone; "
            [ $((ended_at[r] - t_sig)) -gt "$slowest" ] && slowest=$((ended_at[r] - t_sig))
          fi
        done
        # The stopped rank is resumed, and gets the same time to end by itself.
        if [ "$sig" = STOP ]; then
          kill -CONT "${pids[$victim]}" 2>/dev/null
          wait_ranks $((rank_timeout + grace)) "$victim"
          [ "${codes[$victim]}" = - ] && why+="the stopped rank, resumed, did not end within $((rank_timeout + grace)) s; "
        else
          wait_ranks 5 "$victim"
        fi
        # The others must name it.
        named=""
        for r in "${others[@]}"; do
          if said "$r" | sed -E 's/^error: rank [0-9]+: //' | grep -qE "ranks? ([0-9]+(, | and ))*$victim([^0-9]|$)"; then
            named+="$r "
          fi
        done
        [ -n "$named" ] || why+="no other rank's output names rank $victim; "
      fi
      logf=$(hand_logs)
      left=$(reap_leftovers) || why+="left running (killed now): ${left%; }; "
      secs=$((SECONDS - t0))
      if [ -z "$why" ]; then
        record "$name" PASS "the other ranks ended ${slowest} s after the signal at the latest (limit $((rank_timeout + grace)) s), named rank $victim (in the output of rank(s) ${named% }); nothing left running. Rank 0 said: $(said 0 | grep -m 1 '^error:')" "$secs" "$hand_cmd" "$logf"
      else
        record "$name" FAIL "${why%; }" "$secs" "$hand_cmd" "$logf"
      fi
    done
  else
    record "a rank killed or stopped" SKIP "$one_gpu_why" 0 ""
  fi

  # -------------------------------------------------------------------------------------
  # 10. One GPU: 4 nodes of one GPU each played on it (NCCL_HOSTID per node), so that NCCL
  #     runs across nodes here: its network transport, rings, trees and tuning table.
  if [ "$gpus" = 1 ] && ! $mig && [ -n "$shared_gpu_why" ]; then
    record "4 nodes of one GPU each" SKIP "$shared_gpu_why" 0 ""
  elif [ "$gpus" = 1 ] && ! $mig; then
    log=$tmp/gpu-nodes.log
    nodes_report=$tmp/gpu-nodes.md
    nodes_args=(--nodes 4 --bin-dir "$bins" --out "$nodes_report")
    [ "$on_double" = 1 ] && nodes_args+=(--double --quick)
    run_step "4 nodes of one GPU each (bench/gpu-nodes.sh)" 400 "$log" bash "$repo/bench/gpu-nodes.sh" "${nodes_args[@]}"
    if $timed_out; then
      record "4 nodes of one GPU each" FAIL "did not end within 400 s" "$secs" "$cmd" "$log"
    elif [ "$rc" != 0 ]; then
      record "4 nodes of one GPU each" FAIL "exit $rc: $(grep -m 1 -E 'FAIL|gpu-nodes.sh:' "$log")" "$secs" "$cmd" "$log"
    else
      record "4 nodes of one GPU each" PASS "$(grep -c ': PASS$' "$log") steps passed${shared_gpu_note:+ ($shared_gpu_note)}; its report is the last section" "$secs" "$cmd" "$log"
    fi
    left=$(reap_leftovers) || record "4 nodes: leftovers" FAIL "left running (killed now): ${left%; }" 0 ""
  fi
fi

# A last look: nothing of ours may still run.
left=$(reap_leftovers) || record "leftovers" FAIL "left running at the end (killed now): ${left%; }" 0 ""
exec 2>&3 # bash's own notes on the ranks it saw killed stay out of the way

# ---------------------------------------------------------------------------------------
# The report.
total=${#names[@]}
{
  if [ "$on_double" = 1 ]; then
    echo "# GPU check (DRY RUN on the NCCL test double, not a GPU node): $host, $(date '+%Y-%m-%d %H:%M:%S %Z')"
  else
    echo "# GPU check: $host, $(date '+%Y-%m-%d %H:%M:%S %Z')"
  fi
  echo
  if [ "$failed" = 0 ]; then echo "**Result: PASS** ($total steps)"; else echo "**Result: FAIL**: $failed of $total steps failed"; fi
  [ "$warned" = 0 ] || { echo; echo "**$warned WARN** (not a failure; see the table): $(for i in "${!results[@]}"; do
    [ "${results[$i]}" = WARN ] && printf '%s. ' "${names[$i]}"; done)"; }
  echo
  echo "- command: \`$command_line\` (in $repo)"
  if command -v git >/dev/null 2>&1 && git -C "$repo" rev-parse --short HEAD >/dev/null 2>&1; then
    echo "- workbook: commit $(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" status --porcelain 2>/dev/null | grep -q . && echo ', with local changes')"
  fi
  echo "- binaries: $build_note"
  echo "- GPUs ($gpus used${gpu_note:+; $gpu_note}):"
  [ -n "$gpu_list" ] || gpu_list="(no nvidia-smi here: the program's probe counted them)"
  while IFS= read -r line; do
    # nvidia-smi -L indents a GPU's MIG devices under it: so does the list.
    if [[ $line =~ ^[[:space:]]+(.*)$ ]]; then echo "    - ${BASH_REMATCH[1]}"; else echo "  - $line"; fi
  done <<<"$gpu_list"
  if $mig; then
    devs=""
    for i in "${!visible[@]}"; do devs+="${devs:+; }rank $i: ${visible[$i]}"; done
    echo "- MIG: a CUDA process sees one MIG device only (CUDA enumerates the first MIG instance"
    echo "  CUDA_VISIBLE_DEVICES lists), so every multi-rank step starts one rank per device, each with"
    echo "  its own CUDA_VISIBLE_DEVICES, not --nproc-per-node (whose ranks would all see the first MIG"
    echo "  device), and the exercises' checker (its ranks share one CUDA_VISIBLE_DEVICES) is skipped."
    echo "  One MIG device per GPU: the MIG devices of one GPU share its PCI bus id, and NCCL refuses"
    echo "  two ranks of one host on one bus id (\"Duplicate GPU detected\")$([ "$mig_left_out" != 0 ] &&
      echo ": $mig_left_out MIG device(s) left out")."
    echo "  The ranks' devices: $devs"
  fi
  echo "- driver: ${driver:-unknown (no nvidia-smi, no /proc/driver/nvidia/version)}"
  if [ "$on_double" = 1 ] && [ -z "$compute_modes" ]; then
    echo "- compute mode: none (the NCCL test double has no compute modes)"
  elif [ -z "$compute_modes" ]; then
    echo "- compute mode: unknown (no answer from nvidia-smi --query-gpu=compute_mode)"
  elif [ "$(awk -F', *' '{print $3}' <<<"$compute_modes" | sort -u | grep -c .)" = 1 ]; then
    echo "- compute mode: $(awk -F', *' 'NR == 1 {print $3}' <<<"$compute_modes") (every GPU$([ "$on_double" = 1 ] &&
      echo ": played, GPU_CHECK_DOUBLE_COMPUTE_MODE" || echo " nvidia-smi lists"))${shared_gpu_note:+; $shared_gpu_note}"
  else
    echo "- compute modes: $(awk -F', *' '{printf "%sGPU %s: %s", (NR > 1 ? "; " : ""), $1, $3}' <<<"$compute_modes")"
  fi
  echo "- NCCL: ${nccl_version:-unknown}; the program's line: \`${nccl_line:-none}\`"
  echo "- NCCL library file the ranks mapped (/proc/PID/maps, during the perf sweep): ${nccl_mapped:-not seen}"
  echo "- NCCL's own version line (NCCL_DEBUG=INFO): ${nccl_version_info:-none}"
  echo "- NCCL_LIBRARY=${NCCL_LIBRARY:-unset}, NCCL_HOME=${NCCL_HOME:-unset}"
  echo
  echo "| step | result | why | seconds |"
  echo "|---|---|---|---|"
  for i in "${!names[@]}"; do
    printf '| %s | %s | %s | %s |\n' "${names[$i]}" "${results[$i]}" "$(tr '|\n' '/ ' <<<"${reasons[$i]}")" "${times[$i]}"
  done
  echo
  if [ -n "$perf_table" ]; then
    echo "## 07-nccl-perf (-b 8 -e $perf_max -f 2, $gpus ranks)"
    echo
    echo '```'
    echo "$perf_table"
    echo '```'
    echo
  fi
  if [ -f "$tmp/10-nccl-overlap.log" ] && grep -q '^DDP: ' "$tmp/10-nccl-overlap.log"; then
    echo "## 10-nccl-overlap ($gpus rank$([ "$gpus" = 1 ] || echo s)): each way's step, computing and exposed time (ms)"
    echo
    echo '```'
    grep -E '^(Model|Rank 0|DDP|FSDP|Check)' "$tmp/10-nccl-overlap.log"
    echo '```'
    echo
  fi
  if [ -n "$compare_table" ]; then
    echo "## 07-nccl-perf against nccl-tests' all_reduce_perf ($bw_name, GB/s)"
    echo
    echo "The same GPUs, sizes (-b 8 -e $perf_max -f 2) and iterations (-n 20 -w 5); nccl-tests as"
    echo "\`$art -g $gpus\` (one process, every GPU), the workbook one process per GPU. Ratio: ours over"
    echo "nccl-tests'.$([ "$bw_name" = algbw ] && echo " One GPU: busbw is 0 by definition (a factor (n-1)/n), so algbw, the bytes over the time.")"
    echo "Both on NCCL $ours_v ($same_lib)."
    echo
    echo "| size (B) | nccl-tests out of place | ours | ratio | nccl-tests in place | ours | ratio |"
    echo "|---:|---:|---:|---:|---:|---:|---:|"
    echo "$compare_table"
    echo
    if [ -n "$retake_table" ]; then
      echo "Retake of the sizes below 95% ($below B): both programs three times in turn, -n 100 -w 20,"
      echo "out of place, each side's median $bw_name:"
      echo
      echo "| size (B) | nccl-tests | ours | ratio |"
      echo "|---:|---:|---:|---:|"
      echo "$retake_table"
      echo
    fi
  fi
  if [ -n "$nccl_info" ]; then
    echo "## NCCL_DEBUG=INFO (the perf sweep; the first 200 lines)"
    echo
    echo '```'
    echo "$nccl_info"
    echo '```'
    echo
  fi
  if [ -n "$debug_dir" ]; then
    echo "## NCCL's account of one all-reduce (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING)"
    echo
    echo "02-nccl-allreduce on $gpus rank(s), one per $($mig && echo "MIG device" || echo GPU), --size $debug_size, each rank started by"
    echo "hand so that its lines stay apart. NCCL's lines as it sets up the communicator: what it found"
    echo "(INIT: the GPUs, the links between them), the rings and trees it built over them (GRAPH:"
    echo "\`Channel 00/02 : 0 1 2 3\`, \`Trees [0] ...\`), and the tuning table, the time it expects of"
    echo "each algorithm and protocol at each size, from which it picks one per call (TUNING)."
    echo "EXERCISES.md will annotate this log once a real one exists: this is where it comes from."
    echo
    echo '```'
    printf '%s' "$debug_cmd"
    echo '```'
    echo
    [ -n "$debug_note" ] && { echo "$debug_note"; echo; }
    for ((r = 0; r < gpus; r++)); do
      f=$debug_dir/rank$r.log
      [ -s "$f" ] || continue
      n=$(wc -l <"$f")
      echo "### rank $r: $n lines$([ "$n" -gt "$debug_keep" ] && echo ", the first $debug_keep ($((n - debug_keep)) left out)")"
      echo
      echo '```'
      head -n "$debug_keep" "$f"
      echo '```'
      echo
    done
  fi
  echo "## Steps"
  echo
  cat "$details"
  if grep -qvE '^[^:]*: line [0-9]+: +[0-9]+ (Killed|Stopped)' "$tmp/bash-notes.log" 2>/dev/null; then
    echo "### bash's own messages during the hand-started ranks"
    echo
    echo '```'
    grep -vE '^[^:]*: line [0-9]+: +[0-9]+ (Killed|Stopped)' "$tmp/bash-notes.log" | head -n 50
    echo '```'
  fi
  if [ -s "${nodes_report:-}" ]; then
    echo
    sed '1s/^# /## /' "$nodes_report" # its title one level down; its tables' "#" lines are text
  fi
} >"$out"
say "report: $out"
if [ "$failed" = 0 ]; then
  say "all $total steps passed$([ "$warned" = 0 ] || echo ", $warned with a WARN: see the report")"
  exit 0
fi
if [ -n "$build_offline" ]; then
  say "$failed of $total steps FAILED: see $out. The build could not reach crates.io (no network here). What to do: $build_offline"
else
  say "$failed of $total steps FAILED: see $out"
fi
exit 1
