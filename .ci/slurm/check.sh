#!/usr/bin/env bash
# Runs the workbook's batch scripts, unchanged, against a real Slurm on this machine with
# emulated GPUs (4 per node, GRES on dummy devices): one node with 4 tasks, then 2
# emulated nodes with 2 tasks each, on the CPU backend and on the NCCL test double. Then,
# on one node: GPUs bound per task, a CPU partition (--gres=none), the loud warning of a
# GPU job that fell back to the CPU backend, and where the binaries are found (prebuilt,
# CARGO_TARGET_DIR with no cargo, none). Checks each .out file: the tables, the result
# check, and no terminal escape codes. Starts Slurm with start-slurm.sh and stops it by
# pid at the end. Works with cargo's target anywhere (CARGO_TARGET_DIR, build.target-dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'bash .ci/slurm/stop-slurm.sh >/dev/null 2>&1; rm -rf "$out"' EXIT
fail() { echo "slurm check FAILED: $*" >&2; exit 1; }

# shellcheck source=slurm/find-bins.sh
source slurm/find-bins.sh
# Every lesson, from its folder (slurm/find-bins.sh: workbook_lessons), each run through its
# own batch script, slurm/<lesson>.sbatch.
mapfile -t examples < <(workbook_lessons)
[ "${#examples[@]}" != 0 ] || fail "no lesson found (folders NN-name with a [[bin]] named so)"
cargo build --release --quiet --bins
cargo build --release --quiet -p nccl-double --lib
# The binaries, where cargo put them: found as the jobs find them (slurm/find-bins.sh).
unset NCCL_WORKBOOK_BIN_DIR
find_workbook_bins "${examples[@]}" libnccl_double.so || fail "the release build is not where cargo says"
bins=$WORKBOOK_BIN_DIR
echo "binaries: $bins ($WORKBOOK_BIN_FROM)"
double=$out/nccl-double
mkdir -p "$double"
for name in libcuda.so libcuda.so.1 libnccl.so libnccl.so.2; do
  ln -sf "$bins/libnccl_double.so" "$double/$name"
done
# PATH without cargo, as on a compute node that has none.
no_cargo_path=$(tr ':' '\n' <<<"$PATH" | while IFS= read -r d; do [ -x "$d/cargo" ] || printf '%s:' "$d"; done)
no_cargo_path=${no_cargo_path%:}

# expect FILE EXAMPLE RANKS BACKEND TASKS_PER_NODE: what a student must see in the .out file.
# A lesson with no case of its own must say `Check: OK, all N ranks hold ...` and show a
# table row for the last rank.
expect() {
  local file=$1 example=$2 ranks=$3 backend=$4 per_node=$5
  if grep -q $'\e' "$file"; then fail "$file has terminal escape codes"; fi
  case $example in
    00-nccl-hello-world) grep -q "^Hello from $ranks rank$([ "$ranks" = 1 ] || echo s):" "$file" || fail "$file: no roll call of $ranks ranks" ;;
    01-nccl-broadcast) grep -q "^Check: OK, all $ranks ranks hold 42 " "$file" || fail "$file: broadcast check missing" ;;
    02-nccl-allreduce) grep -q "^Check: OK, all $ranks ranks hold $ranks " "$file" || fail "$file: all-reduce check missing" ;;
    # The lessons of 03-06 start from their defaults (4 elements per block, root 0, sum).
    03-nccl-reduce)
      grep -q "^  [CG]PU 0 | $ranks | $ranks | $ranks | $ranks |$" "$file" || fail "$file: the root, rank 0, does not hold $ranks"
      grep -q "^Only the root, rank 0, holds the sum of every rank's buffer; the other ranks' buffers are unchanged.$" "$file" \
        || fail "$file: the line on the root's result is missing"
      grep -q "^Check: OK, all $ranks ranks hold the expected values in all 4 elements$" "$file" || fail "$file: reduce check missing"
      ;;
    04-nccl-allgather)
      grep -q "^  *| from rank 0 *| .*| from rank $((ranks - 1)) *|$" "$file" || fail "$file: no header of $ranks blocks"
      grep -q "^Every rank holds the same buffer: block b is what rank b sent.$" "$file" || fail "$file: the all-gather's line is missing"
      grep -q "^Check: OK, all $ranks ranks hold the expected values in all $((ranks * 4)) elements$" "$file" \
        || fail "$file: all-gather check missing"
      ;;
    05-nccl-reducescatter)
      grep -q "^  *| block 0 → rank 0 *| .*| block $((ranks - 1)) → rank $((ranks - 1)) *|$" "$file" \
        || fail "$file: no header of $ranks blocks"
      local shard=$((ranks * ranks * (ranks + 1) / 2)) # rank n-1's: (1 + 2 + ... + n) × n
      grep -q "^  [CG]PU $((ranks - 1)) | $shard | $shard | $shard | $shard |$" "$file" || fail "$file: rank $((ranks - 1)) does not hold $shard"
      grep -q "^Rank b holds the sum of every rank's block b.$" "$file" || fail "$file: the reduce-scatter's line is missing"
      grep -q "^Check: OK, all $ranks ranks hold the expected values in all 4 elements$" "$file" || fail "$file: reduce-scatter check missing"
      ;;
    06-nccl-alltoall)
      grep -q "^  *| to rank 0 *| .*| to rank $((ranks - 1)) *|$" "$file" || fail "$file: no header of $ranks blocks sent"
      grep -q "^  *| from rank 0 *| .*| from rank $((ranks - 1)) *|$" "$file" || fail "$file: no header of $ranks blocks received"
      grep -q "^Block j of rank i went to rank j, as its block i: the blocks were transposed.$" "$file" \
        || fail "$file: the all-to-all's line is missing"
      grep -q "^Check: OK, all $ranks ranks hold the expected values in all $((ranks * 4)) elements$" "$file" \
        || fail "$file: all-to-all check missing"
      ;;
    07-nccl-perf)
      grep -q "^# Out of bounds values : 0 OK" "$file" || fail "$file: the sweep's check is missing or failed"
      grep -Eq "^ +1048576 +262144 +float +sum +-1 " "$file" || fail "$file: no 1 MiB row"
      grep -q "^#  Rank  $((ranks - 1)) " "$file" || fail "$file: rank $((ranks - 1)) is not listed"
      ;;
    # Rows are the nodes (the default of --tp: the ranks of the first node), columns across.
    09-nccl-split)
      local rows=$((ranks / per_node)) world_sum=$((ranks * (ranks + 1) / 2))
      grep -q "^A grid of $rows row$([ "$rows" = 1 ] || echo s) (tensor-parallel groups) of $per_node ranks" "$file" \
        || fail "$file: no grid of $rows rows of $per_node"
      grep -q "^Rows: after the all-reduce in each tensor-parallel group, color $((rows - 1)) ($per_node ranks):$" "$file" \
        || fail "$file: no table of the last row"
      grep -q "^  [CG]PU $((ranks - 1)), rank $((per_node - 1)) | " "$file" || fail "$file: rank $((ranks - 1)) is not the last of its row"
      grep -q "^Check: OK, all $ranks ranks hold $world_sum in all 4 elements (on $per_node communicator" "$file" \
        || fail "$file: the columns' check does not say $world_sum on $per_node columns"
      ;;
    # Calls NCCL itself (cudarc), and prints what each rank sent and got.
    08-cudarc-allreduce)
      grep -q "^rank $((ranks - 1)): sent $ranks, got \[$((ranks * (ranks + 1) / 2))\.0" "$file" \
        || fail "$file: rank $((ranks - 1)) did not get the sum, $((ranks * (ranks + 1) / 2))"
      ;;
    # No table: a line per way of running a step, each way's results checked.
    10-nccl-overlap)
      for way in "DDP: backward, then one all-reduce" "DDP: buckets all-reduced as they fill" \
        "FSDP: forward, gather when needed" "FSDP: forward, next layer prefetched"; do
        grep -q "^$way  *step  *[0-9.]*  *computing " "$file" || fail "$file: no line for '$way'"
      done
      [ "$(grep -c "^Check: OK, all $ranks ranks hold the expected values" "$file")" = 4 ] \
        || fail "$file: not the 4 ways' checks on $ranks ranks"
      ;;
    *) grep -q "^Check: OK, all $ranks ranks hold " "$file" || fail "$file: no 'Check: OK, all $ranks ranks hold' line" ;;
  esac
  if [ "$example" = 07-nccl-perf ] && [ "$backend" = cpu ]; then
    # Shared memory within a node, TCP between nodes: per pair of ranks.
    local pairs=$((ranks * (ranks - 1) / 2)) shm=$((ranks * (per_node - 1) / 2))
    grep -q "^# transports: $shm pair(s) over shared memory, $((pairs - shm)) over TCP" "$file" \
      || fail "$file: expected $shm shared-memory and $((pairs - shm)) TCP pairs"
  fi
  if [ "$example" != 00-nccl-hello-world ] && [ "$example" != 07-nccl-perf ] && [ "$example" != 08-cudarc-allreduce ] \
    && [ "$example" != 10-nccl-overlap ]; then
    grep -q "^  [CG]PU $((ranks - 1)) | " "$file" || fail "$file: no table row for rank $((ranks - 1))"
  fi
  grep -q "^backend: $backend" "$file" || fail "$file: the backend line does not say $backend"
  if grep -q "WARNING" "$file"; then fail "$file: a warning where none is due"; fi
}

# job FILE [ENV=VALUE...] -- [SBATCH ARGS...]: one job, waited for; its exit status.
job() {
  local file=$1 env=(env)
  shift
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  "${env[@]}" timeout 180 sbatch --wait --quiet --output="$file" "$@"
}

# submit NODES TASKS_PER_NODE BACKEND EXAMPLE: one job of the course, waited for, then checked.
# One node uses the scripts' own request (4 tasks, 4 GPUs); two nodes ask for nodes of 2
# GPUs, as slurm/README.md says for nodes with 2 GPUs.
submit() {
  local nodes=$1 per_node=$2 backend=$3 example=$4
  local file="$out/$example-$nodes-$backend.out"
  local env=()
  if [ "$backend" = nccl ]; then
    env+=(LD_LIBRARY_PATH="$double" NCCL_DOUBLE=1 NCCL_DOUBLE_DEVICES="$per_node")
  fi
  local sbatch=(--nodes="$nodes")
  if [ "$nodes" != 1 ]; then sbatch+=(--ntasks-per-node="$per_node" --gres=gpu:"$per_node"); fi
  local args=(--backend "$backend" --timeout 60)
  if [ "$example" = 07-nccl-perf ]; then args+=(-b 4 -e 1M -f 4 -n 5); fi
  if ! job "$file" ${env[@]+"${env[@]}"} -- "${sbatch[@]}" "slurm/$example.sbatch" "${args[@]}"; then
    cat "$file" >&2 || true
    fail "$example on $nodes node(s), $backend backend: the job failed"
  fi
  grep -q "^job [0-9]*: $((nodes * per_node)) tasks on $nodes node(s) .*, 8 CPUs per task, $per_node GPUs per node: $example" "$file" \
    || fail "$file: the job's first line does not say 8 CPUs per task and $per_node GPUs per node"
  expect "$file" "$example" $((nodes * per_node)) "$backend" "$per_node"
  echo "ok: $example, $nodes node(s) x $per_node tasks, $backend backend"
}

# The cases beyond the course's jobs, on one node of 4 emulated GPUs.
one_node_cases() {
  local file

  # GPUs bound per task: Slurm gives each task its own CUDA_VISIBLE_DEVICES...
  file=$out/bind-slurm.out
  # shellcheck disable=SC2016 # expanded by the job's tasks, not here
  job "$file" -- --ntasks-per-node=4 --gres=gpu:4 --gpu-bind=per_task:1 \
    --wrap 'srun bash -c "echo task \$SLURM_PROCID CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES"' \
    || { cat "$file" >&2; fail "a job with --gpu-bind=per_task:1 failed"; }
  local seen
  seen=$(sed -n 's/^task [0-9]* CUDA_VISIBLE_DEVICES=\([0-9]\)$/\1/p' "$file" | sort -u | tr -d '\n')
  [ "$seen" = 0123 ] || { cat "$file" >&2; fail "--gpu-bind=per_task:1 did not give tasks 0-3 one GPU each (got '$seen')"; }
  echo "ok: Slurm binds one emulated GPU per task (CUDA_VISIBLE_DEVICES 0, 1, 2, 3)"
  # ...and the course's jobs run with it, every rank on a different GPU (its device 0).
  local example
  for example in 00-nccl-hello-world 02-nccl-allreduce; do
    file=$out/bind-$example.out
    if ! job "$file" LD_LIBRARY_PATH="$double" NCCL_DOUBLE=1 NCCL_DOUBLE_DEVICES=4 -- \
        --gpu-bind=per_task:1 "slurm/$example.sbatch" --backend nccl --timeout 60; then
      cat "$file" >&2
      fail "$example with GPUs bound per task (--gpu-bind=per_task:1) on the NCCL double: the job failed"
    fi
    expect "$file" "$example" 4 nccl 4
  done
  # Hello world's rows: one device cell per rank, all different.
  local devices
  devices=$(sed -n 's/^| [0-9]* *| [0-9]* *| [^|]*| [0-9]* *| \([^|]*\)|.*/\1/p' "$out/bind-00-nccl-hello-world.out" | sed 's/ *$//')
  if [ "$(sort -u <<<"$devices" | grep -c .)" != 4 ]; then
    cat "$out/bind-00-nccl-hello-world.out" >&2
    fail "with GPUs bound per task, hello world does not show 4 different GPUs: $(tr '\n' ';' <<<"$devices")"
  fi
  echo "ok: GPUs bound per task (--gpu-bind=per_task:1): hello world and all-reduce on the NCCL double, 4 different GPUs"

  # A CPU partition: no GPU asked for, the CPU backend.
  file=$out/cpu-partition.out
  job "$file" -- --gres=none slurm/02-nccl-allreduce.sbatch --backend cpu --timeout 60 \
    || { cat "$file" >&2; fail "--gres=none ... --backend cpu (a CPU partition) failed"; }
  grep -q "^job [0-9]*: 4 tasks on 1 node(s) .*, no GPU: " "$file" || fail "$file: the first line does not say 'no GPU'"
  expect "$file" 02-nccl-allreduce 4 cpu 4
  echo "ok: a CPU partition: sbatch --gres=none ... --backend cpu"

  # A GPU job that falls back to the CPU backend (no NCCL here) says so loudly, and still
  # ends as the program did.
  file=$out/fallback.out
  job "$file" -- slurm/01-nccl-broadcast.sbatch --timeout 60 \
    || { cat "$file" >&2; fail "a GPU job on the CPU backend (auto) failed"; }
  grep -q "^backend: cpu, because" "$file" || fail "$file: no 'backend: cpu, because' line"
  grep -q "^WARNING: this job was given GPUs (4 per node) but runs on the CPU BACKEND" "$file" \
    || { cat "$file" >&2; fail "$file: a GPU job on the CPU backend without the loud warning"; }
  grep -q "^Check: OK, all 4 ranks hold 42 " "$file" || fail "$file: broadcast check missing"
  echo "ok: a GPU job that fell back to the CPU backend says so in a WARNING block"

  # Binaries you point at (prebuilt, copied), on a node with no cargo.
  mkdir -p "$out/prebuilt"
  cp "$bins/02-nccl-allreduce" "$out/prebuilt/"
  file=$out/prebuilt.out
  job "$file" NCCL_WORKBOOK_BIN_DIR="$out/prebuilt" PATH="$no_cargo_path" -- \
    slurm/02-nccl-allreduce.sbatch --backend cpu --timeout 60 \
    || { cat "$file" >&2; fail "NCCL_WORKBOOK_BIN_DIR=<prebuilt binaries> failed"; }
  grep -qF "binaries: $out/prebuilt (NCCL_WORKBOOK_BIN_DIR)" "$file" || fail "$file: did not use NCCL_WORKBOOK_BIN_DIR"
  expect "$file" 02-nccl-allreduce 4 cpu 4
  # No cargo on the node, and CARGO_TARGET_DIR passed on from the submitting shell.
  file=$out/target-dir.out
  job "$file" CARGO_TARGET_DIR="${bins%/release}" PATH="$no_cargo_path" -- \
    slurm/00-nccl-hello-world.sbatch --backend cpu --timeout 60 \
    || { cat "$file" >&2; fail "CARGO_TARGET_DIR with no cargo on the node failed"; }
  grep -qF "binaries: $bins (CARGO_TARGET_DIR)" "$file" || fail "$file: did not use CARGO_TARGET_DIR"
  expect "$file" 00-nccl-hello-world 4 cpu 4
  # Nothing where they are said to be: a job that fails at once and says where it looked.
  file=$out/not-built.out
  if job "$file" NCCL_WORKBOOK_BIN_DIR="$out/empty" -- slurm/00-nccl-hello-world.sbatch --backend cpu; then
    fail "a job with no binaries succeeded"
  fi
  if ! grep -qF "error: the binaries' folder $out/empty (NCCL_WORKBOOK_BIN_DIR) does not exist" "$file" \
    || ! grep -q "^Where the binaries are looked for" "$file" || ! grep -q "cargo build --release" "$file"; then
    cat "$file" >&2
    fail "$file: a job with no binaries does not say where it looked"
  fi
  echo "ok: binaries found through NCCL_WORKBOOK_BIN_DIR and CARGO_TARGET_DIR with no cargo; none: an error saying where it looked"
}

for nodes in 1 2; do
  per_node=$((4 / nodes))
  SLURM_LOCAL_NODES=$nodes bash .ci/slurm/start-slurm.sh
  for backend in cpu ${SLURM_CHECK_BACKENDS:-nccl}; do
    for example in "${examples[@]}"; do
      # 08 calls NCCL itself: it has no CPU backend to run on.
      if [ "$example" = 08-cudarc-allreduce ] && [ "$backend" = cpu ]; then continue; fi
      submit "$nodes" "$per_node" "$backend" "$example"
    done
  done
  if [ "$nodes" = 1 ]; then one_node_cases; fi
  if [ "$nodes" = 2 ]; then
    echo "--- a two-node all-reduce, as a student sees it:"
    cat "$out/02-nccl-allreduce-2-cpu.out"
  fi
done
echo "slurm check: all jobs passed"
