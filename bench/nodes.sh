#!/usr/bin/env bash
# Emulated nodes: one job whose every "node" is a launcher of this machine with a node
# name of its own (SLURMD_NODENAME), so that its ranks talk to the other nodes' over TCP,
# as EXERCISES.md chapter 9 rehearses a cluster.
#
# As a command (EXERCISES.md chapter 10):
#
#   bench/nodes.sh 8 target/release/07-nccl-perf --nproc-per-node 1 --link 50us,10Gbps
#   bench/nodes.sh --help
#
# Sourced (bench/ring-vs-tree.sh, bench/hierarchy.sh, bench/gpu-nodes.sh), it defines
# on_nodes and runs nothing.

# on_nodes WORK NODES WHAT COMMAND [ARGS...]: runs COMMAND ARGS as node 0 to NODES-1 of
# one job (--nnodes, --node-rank, --master-addr 127.0.0.1 and a master port picked at
# random, picked again if it was taken), node k named node-k, its output in WORK/out.k and
# its errors in WORK/err.k, each node at most 600 s. A node that fails ends the script
# (exit 1), saying WHAT failed on which node and its last lines. Variables for the nodes go
# in COMMAND: `env NCCL_ALGO=Ring bin ...`. A watcher (nodes_watch) stops the nodes if the
# shell that waits for them, or the script, is gone before they end (Ctrl-C, kill -9);
# WORK stays, the caller's to remove.
on_nodes() {
    local work=$1 nodes=$2 what=$3 port node try failed pids ids watcher
    shift 3
    for try in 1 2 3; do
        port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        pids=() ids=()
        for ((node = 0; node < nodes; node++)); do
            SLURMD_NODENAME="node-$node" timeout 600 "$@" --nnodes "$nodes" --node-rank "$node" \
                --master-addr 127.0.0.1 --master-port "$port" >"$work/out.$node" 2>"$work/err.$node" &
            pids+=($!)
            nodes_id "$!"
            ids+=("$NODES_ID")
        done
        nodes_watch_start "" "${ids[@]}"
        watcher=$NODES_WATCHER
        failed=-1
        for ((node = 0; node < nodes; node++)); do
            wait "${pids[$node]}" || ((failed >= 0)) || failed=$node
        done
        nodes_unwatch "$watcher"
        ((failed < 0)) && return 0
        if ((try == 3)) || ! grep -q 'already in use' "$work/err.0"; then
            echo "$(basename "$0"): $what failed on node $failed:" >&2
            tail -3 "$work/err.$failed" >&2
            exit 1
        fi
    done
}

# nodes_stat PID: NODES_STAT=(the fields of /proc/PID/stat from the third on: [0] the
# state, [1] the parent's process id, [19] the start time, which tells a process from a
# later one given the same id); returns 1 if there is no such process.
nodes_stat() {
    local line
    NODES_STAT=()
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    # Past the command's name, "(name)", which may hold spaces and parentheses.
    read -r -a NODES_STAT <<<"${line##*) }"
}

# nodes_id PID: NODES_ID=PID:START, START the process's start time (none if it has ended).
nodes_id() {
    nodes_stat "$1" || true
    NODES_ID="$1:${NODES_STAT[19]:-}"
}

# nodes_alive PID:START: whether that process still runs (not ended, not a later process
# given the same id).
nodes_alive() {
    nodes_stat "${1%%:*}" && [[ -n ${1#*:} && ${NODES_STAT[0]:-} != Z && ${NODES_STAT[19]:-} == "${1#*:}" ]]
}

# nodes_watch SHELL WORK PID:START...: the watcher of the nodes PID... that the shell SHELL
# (its process id) started, run in the background by SHELL (nodes_watch_start). Every
# 0.5 s (one short sleep process each time: little noise beside what the nodes measure)
# it looks, in /proc (without it, it watches nothing), whether SHELL is still its parent
# and the script ($$) still runs. Once either is gone without having ended the watcher
# (nodes_unwatch), as after a kill -9 (no trap runs) or, for a script with no trap of its
# own, a Ctrl-C, it stops every node still running and every process under it (TERM to
# the nodes, TERM to what they leave behind once they have ended, KILL 3 s after the
# first TERM), removes the folder WORK (unless empty, then says so), and ends.
nodes_watch() {
    local shell=$1 work=$2 script id i roots tree=() alive=() tries nodes orphans=0
    local -A under=()
    shift 2
    set +e
    NODES_NAP=
    trap '[[ -z $NODES_NAP ]] || { kill "$NODES_NAP"; wait "$NODES_NAP"; } 2>/dev/null; exit 0' TERM
    trap '' INT HUP
    nodes_stat "$BASHPID" || exit 0
    nodes_id "$$"
    script=$NODES_ID
    while nodes_stat "$BASHPID" && [[ ${NODES_STAT[1]:-} == "$shell" ]] && nodes_alive "$script"; do
        sleep 0.5 &
        NODES_NAP=$!
        wait "$NODES_NAP"
        NODES_NAP=
    done
    trap '' TERM
    # The nodes still running, then every process under them (a launcher's ranks), from
    # their parents' ids now.
    for id in /proc/[0-9]*/stat; do
        id=${id#/proc/}
        id=${id%/stat}
        nodes_stat "$id" && under[${NODES_STAT[1]:-0}]+=" $id:${NODES_STAT[19]:-}"
    done
    for id in "$@"; do
        nodes_alive "$id" && tree+=("$id")
    done
    roots=${#tree[@]}
    for ((i = 0; i < ${#tree[@]}; i++)); do
        # shellcheck disable=SC2206 # the ids PID:START, split on their spaces
        tree+=(${under[${tree[$i]%%:*}]:-})
    done
    for ((i = 0; i < roots; i++)); do
        kill -TERM "${tree[$i]%%:*}" 2>/dev/null
    done
    alive=("${tree[@]}")
    for ((tries = 0; tries < 30 && ${#alive[@]} > 0; tries++)); do
        sleep 0.1
        alive=() nodes=0
        for ((i = 0; i < ${#tree[@]}; i++)); do
            nodes_alive "${tree[$i]}" || continue
            alive+=("${tree[$i]}")
            ((i < roots)) && nodes=1
        done
        if ((nodes == 0 && orphans == 0 && ${#alive[@]} > 0)); then
            orphans=1
            for id in "${alive[@]}"; do
                kill -TERM "${id%%:*}" 2>/dev/null
            done
        fi
    done
    for id in "${alive[@]}"; do
        kill -KILL "${id%%:*}" 2>/dev/null
    done
    if [[ -n $work ]]; then
        rm -rf -- "$work"
        ((roots == 0)) || echo "bench/nodes.sh was killed: its watcher stopped every node" >&2
    fi
    exit 0
}

# nodes_watch_start WORK PID:START...: starts the watcher of this shell's nodes PID...
# (nodes_watch), its PID:START in NODES_WATCHER.
nodes_watch_start() {
    local shell=$BASHPID
    nodes_watch "$shell" "$@" </dev/null >/dev/null &
    nodes_id "$!"
    NODES_WATCHER=$NODES_ID
}

# nodes_unwatch PID:START: ends the watcher PID (none if empty), this shell having done
# with its nodes, and waits for it to end.
nodes_unwatch() {
    [[ -n ${1:-} ]] || return 0
    if nodes_alive "$1"; then
        kill -TERM "${1%%:*}" 2>/dev/null || true
    fi
    wait "${1%%:*}" 2>/dev/null || true
}

nodes_usage() {
    cat <<'USAGE'
Usage: bench/nodes.sh N COMMAND [ARGS...]

Starts COMMAND ARGS as nodes 0 to N-1 of one job on this machine: node k with
SLURMD_NODENAME=node<k> (a host of its own to the ranks, so that they talk to the other
nodes' over TCP) and --nnodes N --node-rank k --master-addr 127.0.0.1 --master-port P,
P a port picked at random (picked again while something listens on it).

Node 0's output (stdout and stderr) comes to the terminal as it comes; the other nodes'
is kept in a temporary folder, and the last lines of every node that failed are printed
at the end (not when node 0 refused its arguments, exit 2: they refused the same). Once
node 0 has ended, the others get 10 s to end too, then are stopped and named. Ctrl-C
stops every node. Nothing is left behind: no process, no file. Not even when the script
is killed (kill -9): a watcher of its own then stops the nodes and removes the folder.

  bench/nodes.sh 2 target/release/00-nccl-hello-world --nproc-per-node 1
  NCCL_ALGO=Tree bench/nodes.sh 4 target/release/02-nccl-allreduce --nproc-per-node 1 --steps

(with CARGO_TARGET_DIR set, its release/ instead of target/release/). Variables set
before bench/nodes.sh reach every node.

Exit status: node 0's; 1 if node 0 succeeded and another node failed; 2 on bad usage.
USAGE
}

# Stops every node still running (Ctrl-C, or the script told to end: TERM, HUP) and exits
# with CODE; the EXIT trap then ends the watcher and removes the temporary folder. A
# launcher that ends takes its ranks with it (the kernel kills them: PR_SET_PDEATHSIG).
# A kill -9 runs no trap: the watcher (nodes_watch) does all this then.
nodes_stop() {
    local code=$1 pid tries
    trap '' INT TERM HUP
    for pid in "${NODES_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for ((tries = 0; tries < 30; tries++)); do
        nodes_running || break
        sleep 0.1
    done
    for pid in "${NODES_PIDS[@]}"; do
        kill -KILL "$pid" 2>/dev/null
    done
    # The watcher first: a wait in a trap may not see a node that has already ended, and
    # would then wait for the watcher.
    nodes_unwatch "$NODES_WATCHER"
    NODES_WATCHER=
    wait 2>/dev/null
    echo "bench/nodes.sh: stopped all ${#NODES_PIDS[@]} nodes" >&2
    exit "$code"
}

# Whether any of the nodes (process ids in NODES_PIDS) still runs.
nodes_running() {
    local pid
    for pid in "${NODES_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null && return 0
    done
    return 1
}

nodes_main() {
    set -u
    local n port tries node status code=0 broken=() stopped=()
    case ${1:-} in
        -h | --help)
            nodes_usage
            return 0
            ;;
    esac
    if (($# == 0)); then
        echo "error: bench/nodes.sh wants a number of nodes and a command: bench/nodes.sh N COMMAND [ARGS...] (--help)" >&2
        return 2
    fi
    if ! [[ $1 =~ ^[1-9][0-9]{0,2}$ ]]; then
        echo "error: bench/nodes.sh: the number of nodes is a whole number from 1 to 999, not '$1' (--help)" >&2
        return 2
    fi
    n=$1
    shift
    if (($# == 0)); then
        echo "error: bench/nodes.sh: no command to run on the $n nodes: bench/nodes.sh N COMMAND [ARGS...] (--help)" >&2
        return 2
    fi
    if ! command -v -- "$1" >/dev/null; then
        echo "error: bench/nodes.sh: no command '$1' (not built yet? cargo build --release)" >&2
        return 2
    fi

    # A port below Linux's ephemeral range (32768 and up, the ports outgoing connections
    # take), where nothing listens: connecting to it is refused.
    for ((tries = 0; tries < 50; tries++)); do
        port=$((20000 + RANDOM % 12000))
        (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null || break
    done

    NODES_PIDS=() NODES_IDS=() NODES_WATCHER=
    NODES_WORK=$(mktemp -d "${TMPDIR:-/tmp}/nodes.XXXXXX") || return 1
    trap 'nodes_unwatch "$NODES_WATCHER"; rm -rf -- "$NODES_WORK"' EXIT
    trap 'nodes_stop 130' INT
    trap 'nodes_stop 143' TERM
    trap 'nodes_stop 129' HUP

    # Node 0 first: it hosts the job's store, which the others join.
    for ((node = 0; node < n; node++)); do
        if ((node == 0)); then
            SLURMD_NODENAME=node0 "$@" --nnodes "$n" --node-rank 0 \
                --master-addr 127.0.0.1 --master-port "$port" &
        else
            SLURMD_NODENAME="node$node" "$@" --nnodes "$n" --node-rank "$node" \
                --master-addr 127.0.0.1 --master-port "$port" >"$NODES_WORK/node$node.log" 2>&1 &
        fi
        NODES_PIDS+=($!)
        nodes_id "$!"
        NODES_IDS+=("$NODES_ID")
    done
    # Should this script be killed (kill -9), its watcher stops the nodes.
    nodes_watch_start "$NODES_WORK" "${NODES_IDS[@]}"

    wait "${NODES_PIDS[0]}"
    code=$?
    # Node 0 has ended, well or not: the others get 10 s to end on their own (a node of a
    # finished job ends at once; one of a failed job at its own deadline), then are stopped,
    # killed 3 s later if the stop is not enough. No wait here is without a bound.
    for ((tries = 0; tries < 100; tries++)); do
        nodes_running || break
        sleep 0.1
    done
    for ((node = 1; node < n; node++)); do
        kill -0 "${NODES_PIDS[$node]}" 2>/dev/null || continue
        stopped+=("$node")
        kill -TERM "${NODES_PIDS[$node]}" 2>/dev/null
    done
    for ((tries = 0; tries < 30 && ${#stopped[@]} > 0; tries++)); do
        nodes_running || break
        sleep 0.1
    done
    for node in "${stopped[@]}"; do
        kill -KILL "${NODES_PIDS[$node]}" 2>/dev/null
    done
    for ((node = 1; node < n; node++)); do
        wait "${NODES_PIDS[$node]}"
        status=$?
        # Node 0 refused its arguments (exit 2): a node that did the same says nothing new;
        # a node stopped here is named once, below.
        ((status == 0 || (code == 2 && status == 2))) && continue
        [[ " ${stopped[*]} " == *" $node "* ]] || broken+=("$node:$status")
    done
    for node in "${stopped[@]}"; do
        echo "bench/nodes.sh: node $node was still running 10 s after node 0 ended: stopped" >&2
    done
    ((code == 0 && ${#stopped[@]} > 0)) && code=1
    for node in "${broken[@]}"; do
        if [[ -s "$NODES_WORK/node${node%%:*}.log" ]]; then
            echo "bench/nodes.sh: node ${node%%:*} failed (exit ${node#*:}); its last lines:" >&2
            tail -n 5 "$NODES_WORK/node${node%%:*}.log" | sed 's/^/    /' >&2
        else
            echo "bench/nodes.sh: node ${node%%:*} failed (exit ${node#*:}), printing nothing" >&2
        fi
    done
    ((code == 0 && ${#broken[@]} > 0)) && code=1
    return "$code"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    nodes_main "$@"
    exit $?
fi
