# shellcheck shell=bash
# Emulated nodes for the benchmarks (sourced by bench/ring-vs-tree.sh and
# bench/hierarchy.sh): one job whose every "node" is a launcher of this machine with a
# node name of its own (SLURMD_NODENAME), so that its ranks talk to the other nodes' over
# TCP, as EXERCISES.md chapter 9 rehearses a cluster.

# on_nodes WORK NODES WHAT COMMAND [ARGS...]: runs COMMAND ARGS as node 0 to NODES-1 of
# one job (--nnodes, --node-rank, --master-addr 127.0.0.1 and a master port picked at
# random, picked again if it was taken), node k named node-k, its output in WORK/out.k and
# its errors in WORK/err.k, each node at most 600 s. A node that fails ends the script
# (exit 1), saying WHAT failed on which node and its last lines. Variables for the nodes go
# in COMMAND: `env NCCL_ALGO=Ring bin ...`.
on_nodes() {
    local work=$1 nodes=$2 what=$3 port node try failed pids
    shift 3
    for try in 1 2 3; do
        port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        pids=()
        for ((node = 0; node < nodes; node++)); do
            SLURMD_NODENAME="node-$node" timeout 600 "$@" --nnodes "$nodes" --node-rank "$node" \
                --master-addr 127.0.0.1 --master-port "$port" >"$work/out.$node" 2>"$work/err.$node" &
            pids+=($!)
        done
        failed=-1
        for ((node = 0; node < nodes; node++)); do
            wait "${pids[$node]}" || ((failed >= 0)) || failed=$node
        done
        ((failed < 0)) && return 0
        if ((try == 3)) || ! grep -q 'already in use' "$work/err.0"; then
            echo "$(basename "$0"): $what failed on node $failed:" >&2
            tail -3 "$work/err.$failed" >&2
            exit 1
        fi
    done
}
