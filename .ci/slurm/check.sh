#!/usr/bin/env bash
# Runs the workbook's batch scripts, unchanged, against a real Slurm on this machine:
# one node with 4 tasks, then 2 emulated nodes with 2 tasks each, on the CPU backend and
# on the NCCL test double. Checks each .out file: the tables, the result check, and no
# terminal escape codes. Starts Slurm with start-slurm.sh and stops it by pid at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=$PWD
out=$(mktemp -d)
trap 'bash .ci/slurm/stop-slurm.sh >/dev/null 2>&1; rm -rf "$out"' EXIT
fail() { echo "slurm check FAILED: $*" >&2; exit 1; }

cargo build --release --quiet --bins
cargo build --release --quiet -p nccl-double --lib
double=$here/target/nccl-double-slurm
mkdir -p "$double"
for name in libcuda.so libcuda.so.1 libnccl.so libnccl.so.2; do
  ln -sf "$here/target/release/libnccl_double.so" "$double/$name"
done

# expect FILE EXAMPLE RANKS BACKEND TASKS_PER_NODE: what a student must see in the .out file.
expect() {
  local file=$1 example=$2 ranks=$3 backend=$4 per_node=$5
  if grep -q $'\e' "$file"; then fail "$file has terminal escape codes"; fi
  case $example in
    00-nccl-hello-world) grep -q "^Hello from $ranks ranks:" "$file" || fail "$file: no roll call of $ranks ranks" ;;
    01-nccl-broadcast) grep -q "^Check: OK, all $ranks ranks hold 42 " "$file" || fail "$file: broadcast check missing" ;;
    02-nccl-allreduce) grep -q "^Check: OK, all $ranks ranks hold $ranks " "$file" || fail "$file: all-reduce check missing" ;;
    03-nccl-perf)
      grep -q "^# Out of bounds values : 0 OK" "$file" || fail "$file: the sweep's check is missing or failed"
      grep -Eq "^ +1048576 +262144 +float +sum +-1 " "$file" || fail "$file: no 1 MiB row"
      grep -q "^#  Rank  $((ranks - 1)) " "$file" || fail "$file: rank $((ranks - 1)) is not listed"
      ;;
  esac
  if [ "$example" = 03-nccl-perf ] && [ "$backend" = cpu ]; then
    # Shared memory within a node, TCP between nodes: per pair of ranks.
    local pairs=$((ranks * (ranks - 1) / 2)) shm=$((ranks * (per_node - 1) / 2))
    grep -q "^# transports: $shm pair(s) over shared memory, $((pairs - shm)) over TCP" "$file" \
      || fail "$file: expected $shm shared-memory and $((pairs - shm)) TCP pairs"
  fi
  if [ "$example" != 00-nccl-hello-world ] && [ "$example" != 03-nccl-perf ]; then
    grep -q "^  [CG]PU $((ranks - 1)) | " "$file" || fail "$file: no table row for rank $((ranks - 1))"
  fi
}

# submit NODES TASKS_PER_NODE BACKEND EXAMPLE: one job, waited for, then checked.
submit() {
  local nodes=$1 per_node=$2 backend=$3 example=$4
  local file="$out/$example-$nodes-$backend.out"
  local env=(env)
  if [ "$backend" = nccl ]; then
    env+=(LD_LIBRARY_PATH="$double" NCCL_DOUBLE=1 NCCL_DOUBLE_DEVICES="$per_node")
  fi
  local args=(--backend "$backend" --timeout 60)
  if [ "$example" = 03-nccl-perf ]; then args+=(-b 4 -e 1M -f 4 -n 5); fi
  if ! "${env[@]}" timeout 180 sbatch --wait --quiet --nodes="$nodes" --ntasks-per-node="$per_node" \
      --output="$file" "slurm/$example.sbatch" "${args[@]}"; then
    cat "$file" >&2 || true
    fail "$example on $nodes node(s), $backend backend: the job failed"
  fi
  expect "$file" "$example" $((nodes * per_node)) "$backend" "$per_node"
  echo "ok: $example, $nodes node(s) x $per_node tasks, $backend backend"
}

for nodes in 1 2; do
  per_node=$((4 / nodes))
  SLURM_LOCAL_NODES=$nodes bash .ci/slurm/start-slurm.sh
  for backend in cpu ${SLURM_CHECK_BACKENDS:-nccl}; do
    for example in 00-nccl-hello-world 01-nccl-broadcast 02-nccl-allreduce 03-nccl-perf; do
      submit "$nodes" "$per_node" "$backend" "$example"
    done
  done
  if [ "$nodes" = 2 ]; then
    echo "--- a two-node all-reduce, as a student sees it:"
    cat "$out/02-nccl-allreduce-2-cpu.out"
  fi
done
echo "slurm check: all jobs passed"
