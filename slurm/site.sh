# shellcheck shell=bash
# Site settings for the workbook's batch scripts: edit them here, once, then read this
# file in the shell you submit from (`source slurm/site.sh`). sbatch takes these
# variables as if they were #SBATCH lines, so the scripts themselves stay unchanged.
# (Options given on the sbatch command line still win over them.)
#
# Leonardo (CINECA), GPU nodes with 4 x A100 each, as an example:
#   export SBATCH_ACCOUNT=<your project account>   # `saldo -b` lists yours
#   export SBATCH_PARTITION=boost_usr_prod
#   export SBATCH_QOS=boost_qos_dbg                # debug runs: short, quick to start
#   export SBATCH_TIMELIMIT=00:05:00
#   export SBATCH_GRES=gpu:4                       # one GPU per task: matches --ntasks-per-node=4

# export SBATCH_ACCOUNT=
# export SBATCH_PARTITION=
# export SBATCH_QOS=
# export SBATCH_TIMELIMIT=00:05:00
# export SBATCH_GRES=gpu:4
