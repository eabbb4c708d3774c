# shellcheck shell=bash
# Site settings for the workbook's batch scripts: edit them here, once, then read this
# file in the shell you submit from (`source slurm/site.sh`). sbatch takes these
# variables as if they were #SBATCH lines, so the scripts themselves stay unchanged.
# (Options given on the sbatch command line still win over them.)
#
# The scripts already ask for one node's 4 GPUs (--gres=gpu:4), 4 tasks and 8 CPUs per
# task. Leonardo (CINECA), GPU nodes with 4 x A100 and 32 cores each, as an example:
#   export SBATCH_ACCOUNT=<your project account>   # `saldo -b` lists yours
#   export SBATCH_PARTITION=boost_usr_prod
#   export SBATCH_QOS=boost_qos_dbg                # debug runs: short, quick to start
#   export SBATCH_TIMELIMIT=00:05:00

# export SBATCH_ACCOUNT=
# export SBATCH_PARTITION=
# export SBATCH_QOS=
# export SBATCH_TIMELIMIT=00:05:00

# Nodes with another number of GPUs, N: SBATCH_GRES=gpu:N here, and --ntasks-per-node=N
# on the sbatch command line (sbatch has no variable for it).
# export SBATCH_GRES=gpu:4
# Each task sees only its own GPU, as its device 0 (instead of all 4, device = rank % 4):
# export SBATCH_GPU_BIND=per_task:1

# Where the binaries are, when the scripts cannot find them themselves: cargo's target is
# set in .cargo/config.toml (build.target-dir) and compute nodes have no cargo, or you use
# binaries built elsewhere. `bash slurm/find-bins.sh` prints where cargo put them.
# export NCCL_WORKBOOK_BIN_DIR=/scratch/$USER/nccl-workbook-target/release
