# shellcheck shell=bash
# Sourced by bench/gpu-check.sh and bench/gpu-nodes.sh: how the rows of a
# `07-nccl-perf -A ... -P ...` run on NCCL followed their sweeps.

# per_sweep_rows FILE: prints "followed rows unknown" for the sweep rows of FILE (rank 0's
# output). Each row ends with "ALGO PROTO" as NCCL chose them, followed when they are the
# values of its sweep's "# -A ALGO:" and "# -P PROTO:" lines; or with "NCCL's choice"
# where NCCL printed none (2.18 and 2.19 print no choice; or NCCL_DEBUG is the user's).
per_sweep_rows() {
  awk '/^# -A /{a=$3; sub(":","",a)} /^# -P /{p=$3; sub(":","",p)}
    /^ +[0-9]/{n++; if ($NF == "choice") u++; else if (tolower($(NF-1)) == a && tolower($NF) == p) ok++}
    END {print ok+0, n+0, u+0}' "$1"
}
