# shellcheck shell=bash
# Shared by the batch scripts: find the example's binary, then start one rank per Slurm
# task with srun. Each rank reads its rank, local rank and master from Slurm's variables
# (SLURM_PROCID, SLURM_LOCALID, SLURM_JOB_NODELIST...): nothing to compute here.
# Usage, from a batch script: source slurm/run.sh EXAMPLE [the example's flags...]
set -euo pipefail

example=$1
shift

# Where cargo put it (NCCL_WORKBOOK_BIN_DIR, cargo metadata, CARGO_TARGET_DIR or
# ./target/release: see slurm/find-bins.sh); an error says where it looked.
# shellcheck source=slurm/find-bins.sh
source slurm/find-bins.sh
find_workbook_bins "$example" || exit 2
bin=$WORKBOOK_BIN_DIR/$example

# srun is given the job's CPUs per task explicitly: since Slurm 22.05 srun does not always
# inherit sbatch's --cpus-per-task (its man page), and would give each task one CPU.
srun_args=()
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then srun_args+=(--cpus-per-task="$SLURM_CPUS_PER_TASK"); fi

# GPUs this job was given per node, as Slurm says (none on a CPU partition).
gpus=${SLURM_GPUS_ON_NODE:-}
if [ -z "$gpus" ] && [ -n "${SLURM_JOB_GPUS:-}" ]; then gpus=$(tr ',' '\n' <<<"$SLURM_JOB_GPUS" | grep -c .); fi
[ "$gpus" != 0 ] || gpus=""
what="${SLURM_NTASKS} tasks on ${SLURM_JOB_NUM_NODES} node(s) (${SLURM_JOB_NODELIST})"
what+=", ${SLURM_CPUS_PER_TASK:-1} CPUs per task"
if [ -n "$gpus" ]; then what+=", $gpus GPUs per node"; else what+=", no GPU"; fi
bind="${SLURM_GPUS_PER_TASK:+--gpus-per-task=$SLURM_GPUS_PER_TASK }${SLURM_GPU_BIND:+--gpu-bind=$SLURM_GPU_BIND}"
if [ -n "$gpus" ] && [ -n "$bind" ]; then what+=" bound per task (${bind% })"; fi
echo "job ${SLURM_JOB_ID}: $what: $example${*:+ $*}"
echo "binaries: $WORKBOOK_BIN_DIR ($WORKBOOK_BIN_FROM)"

# A job that has GPUs and did not ask for the CPU backend means NCCL: if the program
# falls back to the CPU backend anyway (no libnccl found, a driver that fails...), its
# first line says `backend: cpu, because ...`, easy to miss in a long .out. Say it loudly.
asked_cpu=false prev=""
for arg in "$@"; do
  if [ "$arg" = --backend=cpu ] || { [ "$prev" = --backend ] && [ "$arg" = cpu ]; }; then asked_cpu=true; fi
  prev=$arg
done

# Copies the ranks' output through, and after a `backend: cpu, because` line (text or
# JSON) writes the warning to stderr, which the .out file also receives.
watch_backend() {
  local line fell=""
  while IFS= read -r line || [ -n "$line" ]; do
    printf '%s\n' "$line"
    if [ -z "$fell" ] && [[ $line == *"backend: cpu, because"* ]]; then
      fell=${line#*backend: cpu, because }
      fell=${fell%\"*}
      {
        echo "################################################################################"
        echo "WARNING: this job was given GPUs ($gpus per node) but runs on the CPU BACKEND, not NCCL:"
        echo "  because $fell"
        echo "Its numbers are the CPU backend's, not the GPUs'. To run NCCL: make libnccl findable"
        echo "(module load nccl, pip install nvidia-nccl-cu12, or NCCL_LIBRARY=/path/libnccl.so.2),"
        echo "and pass --backend nccl to fail instead of falling back. See slurm/README.md."
        echo "################################################################################"
      } >&2
    fi
  done
  if [ -n "$fell" ]; then echo "WARNING: this GPU job ran on the CPU backend, not NCCL (see above)." >&2; fi
}

if [ -n "$gpus" ] && [ "$asked_cpu" = false ]; then
  set +e
  srun ${srun_args[@]+"${srun_args[@]}"} "$bin" "$@" | watch_backend
  status=("${PIPESTATUS[@]}")
  set -e
  exit "${status[0]}"
fi
srun ${srun_args[@]+"${srun_args[@]}"} "$bin" "$@"
