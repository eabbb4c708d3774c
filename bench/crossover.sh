#!/usr/bin/env bash
# Where the single copy starts to pay: for every collective that has one, the single copy
# (every rank reads the others' buffers where they lie) against the shared slots (messages,
# the ring or the direct exchange), by size and by ranks, on this machine.
#
#   bench/crossover.sh                 # 16 KiB ... 16 MiB, 2, 3 and 4 ranks, 3 repeats (a few minutes)
#   bench/crossover.sh --quick         # 64 KiB and 1 MiB, 2 and 4 ranks, broadcast and all-reduce, once
#   bench/crossover.sh --ranks 4 --ops broadcast -b 16K -e 1M -f 2
#   bench/crossover.sh --help
#
# It is a benchmark, not a test: CI never runs it, and its numbers mean something only on
# a quiet machine. The tuner's thresholds (backend-cpu/src/tuner.rs,
# single_copy_from) come from its crossovers.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: bench/crossover.sh [options]

For each collective (broadcast, reduce, all_reduce, all_gather, reduce_scatter,
alltoall: each has a single-copy path) and each rank count, 07-nccl-perf (release build,
CPU backend, one host, float, sum, root 0) runs the same sweep twice, alternating,
--repeat times:

  single copy   NCCL_ALGO=single-copy   every rank reads the others' buffers (a reduce:
                                        the root reads them all)
  slots         NCCL_ALGO=^single-copy  what runs without it: the shared slots (the ring,
                                        the chain, pairwise, or direct up to 16 KiB)

and once more with neither (NCCL_ALGO unset) to read which algorithm the tuner picks
(07-nccl-perf's algo column). Each time is the median of the repeats, in µs per call
(mean over ranks of loop time / iterations); "both" adds the out-of-place and in-place
times. Each table ends with the sizes at which the single copy was faster and those at
which the tuner takes it, as runs of neighbouring sizes ("from 64 KiB" to the largest,
"16 KiB to 2 MiB" for the reduce, whose root reads alone). Ranks outnumbering the cores
(nproc, or NCCL_WORKBOOK_CORES) take turns on them: "oversubscribed".

Options:
  --quick           64K and 1M; ranks 2,4; broadcast,all_reduce; -n 5; one repeat
  -b, -e, -f        smallest and largest size (K/M binary) and the factor between
                    sizes, as 07-nccl-perf takes them (default 16K, 16M, 4)
  --ranks LIST      rank counts (default 2,3,4)
  --ops LIST        collectives (default broadcast,reduce,all_reduce,all_gather,reduce_scatter,alltoall)
  -n, --iters N     timed calls per size (default 20)
  -w, --warmup N    warm-up calls per size (default 3)
  --repeat R        runs of each side, the median kept (default 3)
  --timeout S       seconds any one launch may take (default 300)
  --no-build        do not run cargo build (use the release 07-nccl-perf as it is)
  -h, --help        this help
EOF
}

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(dirname "$bench_dir")
target_dir=${CARGO_TARGET_DIR:-$repo_dir/target}
case "$target_dir" in
    /*) ;;
    *) target_dir="$PWD/$target_dir" ;;
esac
perf_bin="$target_dir/release/07-nccl-perf"

min=16K
max=16M
factor=4
ranks="2,3,4"
ops="broadcast,reduce,all_reduce,all_gather,reduce_scatter,alltoall"
iters=20
warmup=3
repeat=3
limit=300
build=1

die() {
    echo "bench/crossover.sh: $*" >&2
    exit 2
}

number() {
    [[ "$2" =~ ^[0-9]+$ ]] || die "$1 takes a whole number, not '$2'"
}

while (($#)); do
    case "$1" in
        --quick)
            min=64K max=1M factor=16 ranks="2,4" ops="broadcast,all_reduce" iters=5 warmup=1 repeat=1
            ;;
        -b | -e | -f | --ranks | --ops | -n | --iters | -w | --warmup | --repeat | --timeout)
            (($# >= 2)) || die "$1 needs a value"
            case "$1" in
                -b) min=$2 ;;
                -e) max=$2 ;;
                -f) number "$1" "$2" && factor=$2 ;;
                --ranks) ranks=$2 ;;
                --ops) ops=$2 ;;
                -n | --iters) number "$1" "$2" && iters=$2 ;;
                -w | --warmup) number "$1" "$2" && warmup=$2 ;;
                --repeat) number "$1" "$2" && repeat=$2 ;;
                --timeout) number "$1" "$2" && limit=$2 ;;
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
((repeat >= 1 && iters >= 1)) || die "--repeat and --iters must be at least 1"
IFS=, read -r -a rank_list <<<"$ranks"
IFS=, read -r -a op_list <<<"$ops"
for op in "${op_list[@]}"; do
    case "$op" in
        broadcast | reduce | all_reduce | all_gather | reduce_scatter | alltoall) ;;
        *) die "unknown collective '$op': broadcast, reduce, all_reduce, all_gather, reduce_scatter or alltoall" ;;
    esac
done
for n in "${rank_list[@]}"; do
    number --ranks "$n"
    ((n >= 2)) || die "--ranks: a single copy needs at least 2 ranks"
done

if ((build)); then
    (cd "$repo_dir" && cargo build --release --quiet -p nccl-perf) || die "cargo build failed"
fi
[[ -x "$perf_bin" ]] || die "no $perf_bin (run without --no-build)"
command -v jq >/dev/null || die "jq is needed to read 07-nccl-perf's JSON (apt-get install jq)"

cores=${NCCL_WORKBOOK_CORES:-$(nproc)}
work=$(mktemp -d "${TMPDIR:-/tmp}/crossover.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One sweep of `iters` timed calls per size: prints "size oop_us ip_us algo_oop" per row.
sweep() {
    local n=$1 op=$2 algo=$3 iters=$4 warmup=$5 out
    out="$work/run.json"
    if ! NCCL_ALGO=$algo timeout "$limit" "$perf_bin" --backend cpu --nproc-per-node "$n" --coll "$op" \
        -b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" --format json \
        >"$out" 2>"$work/err"; then
        echo "bench/crossover.sh: $op on $n ranks, NCCL_ALGO=$algo failed:" >&2
        tail -3 "$work/err" >&2
        exit 1
    fi
    jq -r '.rows[] | "\(.size) \(.out_of_place.time_us) \(.in_place.time_us) \(.out_of_place.algo)"' "$out"
}

echo "# bench/crossover.sh: the single copy against the slots, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# machine: $(uname -n), $cores cores ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'))"
echo "# load: $(uptime | sed 's/.*load average/load average/')"
echo "# sizes -b $min -e $max -f $factor, -n $iters -w $warmup, median of $repeat; times in µs per call"
summary="$work/summary"
: >"$summary"
for n in "${rank_list[@]}"; do
    state="not oversubscribed"
    ((n > cores)) && state="oversubscribed"
    for op in "${op_list[@]}"; do
        rows="$work/rows"
        : >"$rows"
        for ((k = 0; k < repeat; k++)); do
            sweep "$n" "$op" single-copy "$iters" "$warmup" | sed 's/^/copy /' >>"$rows"
            sweep "$n" "$op" '^single-copy' "$iters" "$warmup" | sed 's/^/slots /' >>"$rows"
        done
        sweep "$n" "$op" "" 1 0 | awk '{print "tuner", $1, 0, 0, $4}' >>"$rows"
        echo
        echo "## $op, $n ranks on $cores cores ($state)"
        echo
        awk -v op="$op" -v n="$n" -v state="$state" -v summary="$summary" '
            function median(list,   a, m, i, j, t) {
                m = split(list, a, " ")
                for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
                return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
            }
            # Sizes as the sweep asked them: 07-nccl-perf rounds some down to whole floats per rank.
            function human(b) {
                if (b >= 1000000) return sprintf("%.0f MiB", b / 1048576)
                if (b >= 1000) return sprintf("%.0f KiB", b / 1024)
                return b " B"
            }
            # The sizes where flag[i] holds, as runs of neighbouring sizes: "from 64 KiB"
            # (to the largest), "16 KiB to 2 MiB", several runs joined by commas, or "never".
            function spans(flag,   i, j, out) {
                out = ""
                for (i = 1; i <= count; i++) {
                    if (!flag[i]) continue
                    for (j = i; j < count && flag[j + 1]; j++) {}
                    out = out (out == "" ? "" : ", ") (j == count ? "from " human(order[i]) : (i == j ? "at " human(order[i]) : human(order[i]) " to " human(order[j])))
                    i = j
                }
                return out == "" ? "never" : out
            }
            $1 == "tuner" { tuner[$2] = $5; next }
            {
                if (!($2 in seen)) { seen[$2] = 1; order[++count] = $2 }
                oop[$1, $2] = oop[$1, $2] " " $3
                ip[$1, $2] = ip[$1, $2] " " $4
            }
            END {
                printf "| %10s | %12s | %12s | %12s | %12s | %8s | %-14s |\n", "size", "copy oop", "slots oop", "copy ip", "slots ip", "faster", "tuner picks"
                printf "|%s|%s|%s|%s|%s|%s|%s|\n", "-----------:", "-------------:", "-------------:", "-------------:", "-------------:", "---------:", "----------------"
                for (i = 1; i <= count; i++) {
                    s = order[i]
                    co = median(oop["copy", s]); so = median(oop["slots", s])
                    ci = median(ip["copy", s]); si = median(ip["slots", s])
                    c = co + ci; d = so + si
                    wins[i] = c < d
                    printf "| %10s | %12.1f | %12.1f | %12.1f | %12.1f | %8s | %-14s |\n", human(s), co, so, ci, si, (wins[i] ? "copy" : "slots"), tuner[s]
                }
                for (i = 1; i <= count; i++) picks[i] = tuner[order[i]] == "single-copy"
                from = spans(wins); picked = spans(picks)
                printf "\ncrossover: the single copy is faster %s; the tuner takes it %s\n", from, picked
                printf "| %-14s | %5d | %-18s | %-22s | %-22s |\n", op, n, state, from, picked >> summary
            }' "$rows"
    done
done
echo
echo "## Summary (-b $min -e $max -f $factor)"
echo
printf "| %-14s | %5s | %-18s | %-22s | %-22s |\n" collective ranks host "copy faster" "tuner takes it"
echo "|----------------|------:|--------------------|------------------------|------------------------|"
cat "$summary"
