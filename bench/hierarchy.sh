#!/usr/bin/env bash
# Hierarchical or flat, over a simulated network: exercise 12's reference solution (a
# reduce-scatter inside each node, an all-reduce of one shard across nodes, an all-gather
# inside the node, on split communicators) against the flat all-reduce of every rank, in
# the same job, on N emulated nodes of this machine (one host name each: shared memory
# inside a node, TCP between nodes, every TCP link simulated with --link).
#
#   bench/hierarchy.sh                                  # 2 nodes of 2 ranks, 50us,10Gbps
#   bench/hierarchy.sh --nodes 4 --per-node 2 --link 5us,25Gbps --sizes "64K 1M 16M"
#   bench/hierarchy.sh --help
#
# A benchmark, not a test: CI never runs it, and its numbers mean something only on a
# quiet machine (with fewer cores than ranks, the ranks take turns).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bench/hierarchy.sh [options]

sol12-hierarchical-allreduce (release build, CPU backend) on --nodes emulated nodes of
--per-node ranks, one job per size: the hierarchical all-reduce and the flat one (the
world's communicator), each timed over --iters calls; the median of --repeat jobs, in µs
per call. NCCL_ALGO picks the flat one's algorithm (default Ring; "" for the tuner's).

Options:
  --nodes N         emulated nodes (default 2)
  --per-node N      ranks per node (default 2)
  --link L          the simulated link, LATENCY,BANDWIDTH (default 50us,10Gbps)
  --sizes LIST      buffer sizes, with K, M, G (default "64K 1M 8M")
  --algo A          NCCL_ALGO for every all-reduce (default Ring)
  -n, --iters N     timed calls per job (default 10)
  --repeat R        jobs per size, the median kept (default 3)
  --no-build        use the release binary as it is
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
bin="$target_dir/release/sol12-hierarchical-allreduce"

nodes=2 per_node=2 link=50us,10Gbps sizes="64K 1M 8M" algo=Ring iters=10 repeat=3 build=1

die() {
    echo "bench/hierarchy.sh: $*" >&2
    exit 2
}

number() {
    if ! [[ "$2" =~ ^[0-9]+$ ]] || (($2 < 1)); then
        die "$1 takes a whole number of at least 1, not '$2'"
    fi
}

while (($#)); do
    case "$1" in
        --nodes | --per-node | --link | --sizes | --algo | -n | --iters | --repeat)
            (($# >= 2)) || die "$1 needs a value"
            case "$1" in
                --nodes) number "$1" "$2" && nodes=$2 ;;
                --per-node) number "$1" "$2" && per_node=$2 ;;
                --link) link=$2 ;;
                --sizes) sizes=$2 ;;
                --algo) algo=$2 ;;
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
    (cd "$repo_dir" && cargo build --release --quiet -p solution-12-hierarchical-allreduce) || die "cargo build failed"
fi
[[ -x "$bin" ]] || die "no $bin (run without --no-build)"

work=$(mktemp -d "${TMPDIR:-/tmp}/hierarchy.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One job on every node (bench/nodes.sh): prints "hierarchical_us flat_us" (node 0's two
# Time: lines).
job() {
    local size=$1
    on_nodes "$work" "$nodes" "--size $size" env NCCL_ALGO="$algo" "$bin" --backend cpu \
        --nproc-per-node "$per_node" --link "$link" --size "$size" --iters "$iters" --show 0
    grep '^Time:' "$work/out.0" | awk '{ printf "%s ", $2 } END { print "" }'
}

echo "# bench/hierarchy.sh: all-reduce, hierarchical against flat, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# machine: $(uname -n), $(nproc) cores; load: $(uptime | sed 's/.*load average/load average/')"
echo "# $nodes emulated nodes of $per_node rank(s), --link $link, NCCL_ALGO=${algo:-(unset)}, -n $iters, median of $repeat, µs per call"
echo
printf "| %10s | %14s | %10s | %10s |\n" "size" "hierarchical" "flat" "hier/flat"
printf "|%s|%s|%s|%s|\n" "-----------:" "---------------:" "-----------:" "-----------:"
for size in $sizes; do
    rows="$work/rows"
    : >"$rows"
    for ((k = 0; k < repeat; k++)); do
        job "$size" >>"$rows"
    done
    awk -v size="$size" '
        function median(list,   a, m, i, j, t) {
            m = split(list, a, " ")
            for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
            return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
        }
        { h = h " " $1; f = f " " $2 }
        END { mh = median(h); mf = median(f); printf "| %10s | %14.1f | %10.1f | %10.2f |\n", size, mh, mf, mh / mf }' "$rows"
done
