# shellcheck shell=bash
# Shared by the batch scripts: check the example is built, then start one rank per Slurm
# task with srun. Each rank reads its rank, local rank and master from Slurm's variables
# (SLURM_PROCID, SLURM_LOCALID, SLURM_JOB_NODELIST...): nothing to compute here.
# Usage, from a batch script: source slurm/run.sh EXAMPLE [the example's flags...]
set -euo pipefail

example=$1
shift
bin=./target/release/$example
if [ ! -x "$bin" ]; then
  echo "error: $bin is not built. On the login node, from the workbook's folder, run" >&2
  echo "  cargo build --release" >&2
  echo "then submit again (compute nodes build nothing)." >&2
  exit 2
fi

echo "job ${SLURM_JOB_ID}: ${SLURM_NTASKS} tasks on ${SLURM_JOB_NUM_NODES} node(s) (${SLURM_JOB_NODELIST}): $example${*:+ $*}"
srun "$bin" "$@"
