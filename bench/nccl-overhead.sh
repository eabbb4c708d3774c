#!/usr/bin/env bash
# What the workbook's harness adds to each NCCL call: 07-nccl-perf's timed loop against a
# bare loop of the same ncclAllReduce calls (nccl-double-bare: nccl-tests' loop, nothing
# around the calls), both on the NCCL test double, which plays NCCL 2.18 or 2.23. See --help.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/nccl-overhead.sh [--ranks 1,2] [--sizes 8,64K,1M] [--iters N] [--repeat K]

Runs, on the NCCL test double (release build, as CI builds it), for each number of ranks
and size:
  - nccl-double-bare: a blocking communicator, N all-reduces back to back, one wait
    (nccl-tests' loop); and the same with a non-blocking communicator on NCCL 2.23
    (every call launched by a helper thread and polled to ncclSuccess before the next);
  - 07-nccl-perf -C 1 and -C 0 (rank 0's time, -a 0): the workbook's timed loop.
Prints, per call, the host's time to issue it (nccl-tests' cputime) and the time until
all had finished, each the median of K runs, and the harness's difference. The double's
collectives go through files: its times are the host's, not a GPU's; what counts here is
the difference, which is the harness's own.

Options:
  --ranks LIST   numbers of ranks (default 1,2)
  --sizes LIST   sizes in bytes, K/M 1024-based (default 8,64K,1M)
  --iters N      timed calls per run (default 2000)
  --repeat K     runs per figure, the median is shown (default 3)
EOF
}

ranks=1,2 sizes=8,64K,1M iters=2000 repeat=3
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) ranks=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
cargo build --quiet --release -p nccl-double -p nccl-perf
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
rel=$target/release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in libcuda.so libcuda.so.1 libnccl.so libnccl.so.2; do
  ln -s "$rel/libnccl_double.so" "$work/$name"
done
export LD_LIBRARY_PATH=$work NCCL_DOUBLE=1 NCCL_DOUBLE_DEVICES=4

bytes() {
  case $1 in
    *K) echo $((${1%K} * 1024)) ;;
    *M) echo $((${1%M} * 1024 * 1024)) ;;
    *) echo "$1" ;;
  esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# bare RANKS BYTES [--nonblocking]: "issue_us time_us" of rank 0.
bare() {
  local n=$1 b=$2 extra=${3:-} id=$work/id.$RANDOM r out
  for ((r = n - 1; r >= 0; r--)); do
    # Each rank its own GPU, as Slurm's per-task binding gives it.
    # shellcheck disable=SC2086 # $extra is one flag or none
    CUDA_VISIBLE_DEVICES=$r timeout -k 5 300 "$rel/nccl-double-bare" --rank "$r" --world "$n" --id-file "$id" --bytes "$b" \
      --iters "$iters" $extra >"$work/bare.$r" &
  done
  wait
  out=$(cat "$work/bare.0")
  if [ -z "$out" ]; then
    echo "error: nccl-double-bare failed or ran past 300 s ($n ranks, $b bytes${extra:+, $extra})" >&2
    exit 1
  fi
  rm -f "$id"
  sed -E 's/.*issue_us=([0-9.]+) time_us=([0-9.]+).*/\1 \2/' <<<"$out"
}

# perf RANKS BYTES C: rank 0's time per call (out of place) of 07-nccl-perf -C C.
perf() {
  local t
  t=$(timeout -k 5 300 "$rel/07-nccl-perf" --backend nccl --nproc-per-node "$1" -b "$2" -e "$2" -n "$iters" -w 5 -a 0 -C "$3" \
    --timeout 60 | awk '$1 ~ /^[0-9]+$/ { print $6; exit }')
  if [ -z "$t" ]; then
    echo "error: 07-nccl-perf failed or ran past 300 s ($1 ranks, $2 bytes, -C $3)" >&2
    exit 1
  fi
  echo "$t"
}

printf '# the harness against a bare loop of ncclAllReduce, on the NCCL test double (%s calls, median of %s)\n' \
  "$iters" "$repeat"
printf '# us per call; issue = the host'"'"'s time to issue it (cputime), time = until all finished\n'
printf '%5s %8s | %10s %10s %8s | %10s %10s %8s | %16s %16s\n' ranks size \
  "bare issue" "harness" added "bare time" harness added "2.23 non-block" "2.23 nb time"
IFS=, read -r -a rank_list <<<"$ranks"
IFS=, read -r -a size_list <<<"$sizes"
for n in "${rank_list[@]}"; do
  for s in "${size_list[@]}"; do
    b=$(bytes "$s")
    bi=() bt=() hi=() ht=() ni=() nt=()
    for ((k = 0; k < repeat; k++)); do
      read -r i t < <(bare "$n" "$b")
      bi+=("$i") bt+=("$t")
      read -r i t < <(NCCL_DOUBLE_VERSION=22304 bare "$n" "$b" --nonblocking)
      ni+=("$i") nt+=("$t")
      hi+=("$(perf "$n" "$b" 1)") ht+=("$(perf "$n" "$b" 0)")
    done
    m() { printf '%s\n' "$@" | median; }
    BI=$(m "${bi[@]}") BT=$(m "${bt[@]}") HI=$(m "${hi[@]}") HT=$(m "${ht[@]}") NI=$(m "${ni[@]}") NT=$(m "${nt[@]}")
    printf '%5s %8s | %10.2f %10.2f %+8.2f | %10.2f %10.2f %+8.2f | %16.2f %16.2f\n' "$n" "$s" \
      "$BI" "$HI" "$(awk -v a="$HI" -v b="$BI" 'BEGIN { print a - b }')" \
      "$BT" "$HT" "$(awk -v a="$HT" -v b="$BT" 'BEGIN { print a - b }')" "$NI" "$NT"
  done
done
