#!/usr/bin/env bash
# Ring or tree, over a simulated network: the all-reduce on N emulated nodes of this
# machine (one host name each, TCP between them, every TCP link simulated with --link),
# with the ring (NCCL_ALGO=Ring), the tree (NCCL_ALGO=Tree) and what the tuner picks.
#
#   bench/ring-vs-tree.sh                         # 8 nodes of 1 rank, 5us,10Gbps and 50us,10Gbps
#   bench/ring-vs-tree.sh --nodes 4 --per-node 2 --links 20us,25Gbps -b 16K -e 4M
#   bench/ring-vs-tree.sh --help
#
# A benchmark, not a test: CI never runs it, and its numbers mean something only on a
# quiet machine with at least as many cores as ranks (else the ranks take turns).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bench/ring-vs-tree.sh [options]

07-nccl-perf (release build, CPU backend, float, sum) runs the all-reduce on --nodes
emulated nodes of --per-node ranks, for each --links value, three times alternating:
NCCL_ALGO=Ring, NCCL_ALGO=Tree, and NCCL_ALGO unset (what the tuner picks); each time is
the median of --repeat runs, out of place, in µs per call.

Options:
  --nodes N         emulated nodes (default 8)
  --per-node N      ranks per node (default 1)
  --links LIST      simulated links, LATENCY,BANDWIDTH;... (default "5us,10Gbps;50us,10Gbps")
  -b, -e, -f        smallest and largest size and the factor (default 16K, 4M, 4)
  -n, --iters N     timed calls per size (default 20)
  --repeat R        runs of each, the median kept (default 3)
  --no-build        use the release 07-nccl-perf as it is
  -h, --help        this help
USAGE
}

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/nodes.sh
source "$bench_dir/nodes.sh"
repo_dir=$(dirname "$bench_dir")
target_dir=${CARGO_TARGET_DIR:-$repo_dir/target}
case "$target_dir" in
    /*) ;;
    *) target_dir="$PWD/$target_dir" ;;
esac
perf_bin="$target_dir/release/07-nccl-perf"

nodes=8 per_node=1 links="5us,10Gbps;50us,10Gbps" min=16K max=4M factor=4 iters=20 repeat=3 build=1

die() {
    echo "bench/ring-vs-tree.sh: $*" >&2
    exit 2
}

number() {
    if ! [[ "$2" =~ ^[0-9]+$ ]] || (($2 < 1)); then
        die "$1 takes a whole number of at least 1, not '$2'"
    fi
}

while (($#)); do
    case "$1" in
        --nodes | --per-node | --links | -b | -e | -f | -n | --iters | --repeat)
            (($# >= 2)) || die "$1 needs a value"
            case "$1" in
                --nodes) number "$1" "$2" && nodes=$2 ;;
                --per-node) number "$1" "$2" && per_node=$2 ;;
                --links) links=$2 ;;
                -b) min=$2 ;;
                -e) max=$2 ;;
                -f) number "$1" "$2" && factor=$2 ;;
                -n | --iters) number "$1" "$2" && iters=$2 ;;
                --repeat) number "$1" "$2" && repeat=$2 ;;
            esac
            shift
            ;;
        --no-build) build=0 ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown option '$1' (--help lists them)" ;;
    esac
    shift
done
((nodes >= 2)) || die "--nodes: a network needs at least 2 nodes"

if ((build)); then
    (cd "$repo_dir" && cargo build --release --quiet -p nccl-perf) || die "cargo build failed"
fi
[[ -x "$perf_bin" ]] || die "no $perf_bin (run without --no-build)"
command -v jq >/dev/null || die "jq is needed to read 07-nccl-perf's JSON (apt-get install jq)"

work=$(mktemp -d "${TMPDIR:-/tmp}/ring-vs-tree.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One sweep on every node (bench/nodes.sh): prints "size time_us algo" per row (node 0's
# JSON).
sweep() {
    local link=$1 algo=$2
    on_nodes "$work" "$nodes" "--link $link NCCL_ALGO=$algo" env NCCL_ALGO="$algo" "$perf_bin" --backend cpu \
        --nproc-per-node "$per_node" --link "$link" --coll all_reduce \
        -b "$min" -e "$max" -f "$factor" -n "$iters" -w 3 --format json
    jq -r '.rows[] | "\(.size) \(.out_of_place.time_us) \(.out_of_place.algo)"' "$work/out.0"
}

echo "# bench/ring-vs-tree.sh: all-reduce, ring against tree, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# machine: $(uname -n), $(nproc) cores; load: $(uptime | sed 's/.*load average/load average/')"
echo "# $nodes emulated nodes of $per_node rank(s), -n $iters, median of $repeat, out of place, µs per call"
IFS=';' read -r -a link_list <<<"$links"
for link in "${link_list[@]}"; do
    rows="$work/rows"
    : >"$rows"
    for ((k = 0; k < repeat; k++)); do
        {
            sweep "$link" Ring | sed 's/^/ring /'
            sweep "$link" Tree | sed 's/^/tree /'
            sweep "$link" "" | sed 's/^/tuner /'
        } >>"$rows"
    done
    echo
    echo "## --link $link"
    echo
    awk '
        function median(list,   a, m, i, j, t) {
            m = split(list, a, " ")
            for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
            return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
        }
        {
            if (!($2 in seen)) { seen[$2] = 1; order[++count] = $2 }
            t[$1, $2] = t[$1, $2] " " $3
            if ($1 == "tuner") picked[$2] = $4
        }
        END {
            printf "| %10s | %10s | %10s | %10s | %-15s |\n", "size (B)", "ring", "tree", "tree/ring", "tuner (µs, algo)"
            printf "|%s|%s|%s|%s|%s|\n", "-----------:", "-----------:", "-----------:", "-----------:", "-----------------"
            for (i = 1; i <= count; i++) {
                s = order[i]; r = median(t["ring", s]); tr = median(t["tree", s]); u = median(t["tuner", s])
                printf "| %10d | %10.1f | %10.1f | %10.2f | %7.1f %-7s |\n", s, r, tr, tr / r, u, picked[s]
            }
        }' "$rows"
done
