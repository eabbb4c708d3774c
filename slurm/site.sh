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
# Keep NVLink: let every task reach the node's GPUs (the scripts' --gres=gpu:4, or
# --gpus-per-node=4, with device = rank % 4). Per-task GPUs (--gpus-per-task=1) under the
# site's ConstrainDevices=yes leave each task's cgroup its own GPU only, and NCCL falls back
# from NVLink to host memory between GPUs of one node (NCCL_DEBUG=INFO says `via SHM`;
# NVIDIA/nccl#1066): busbw collapses. Where a site insists on per-task GPUs, Slurm 23.11
# and later let the tasks reach each other's (srun reads this in the job; older Slurm
# refuses the value):
# export SLURM_GRES_FLAGS=allow-task-sharing

# Where the binaries are, when the scripts cannot find them themselves: cargo's target is
# set in .cargo/config.toml (build.target-dir) and compute nodes have no cargo, or you use
# binaries built elsewhere. `bash slurm/find-bins.sh` prints where cargo put them.
# export NCCL_WORKBOOK_BIN_DIR=/scratch/$USER/nccl-workbook-target/release
