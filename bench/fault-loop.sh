#!/usr/bin/env bash
# The fault loop: kill -9 or SIGSTOP a random rank at a random moment of a 3-rank
# all-reduce, many times, on both transports, and check every run: it fails (exit 1)
# within --timeout plus a constant, the launcher names the rank that was hit, and nothing
# is left (no process of the job, no file in /dev/shm). A check of the promises in
# README's "Errors, and when a rank fails"; a benchmark, not a test: CI does not run it.
#
#   bench/fault-loop.sh [RUNS_PER_TRANSPORT] [TIMEOUT_S]     (default 100 and 3)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
timeout_s=${2:-3}
cargo build --release --quiet --bin 02-nccl-allreduce
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/02-nccl-allreduce
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

bad=0
worst=0
for transport in shm tcp; do
  for ((i = 0; i < runs; i++)); do
    victim=$((RANDOM % 3))
    if ((RANDOM % 2)); then sig=KILL; else sig=STOP; fi
    delay_ms=$((RANDOM % 2000))
    "$bin" --backend cpu --transport "$transport" --nproc-per-node 3 --size 16M --iters 100000 \
      --timeout "$timeout_s" >"$out/stdout" 2>"$out/stderr" &
    launcher=$!
    sleep "$(printf '0.%03d' "$delay_ms")"
    kids=()
    for _ in $(seq 100); do
      mapfile -t kids < <(tr ' ' '\n' <"/proc/$launcher/task/$launcher/children" 2>/dev/null | grep . || true)
      [ "${#kids[@]}" -ge 3 ] && break
      sleep 0.01
    done
    if [ "${#kids[@]}" -lt 3 ]; then
      wait "$launcher" || true
      continue
    fi
    start=$(date +%s%N)
    kill -s "$sig" "${kids[$victim]}" 2>/dev/null || true
    rc=0
    wait "$launcher" || rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ "$sig" = STOP ]; then kill -9 "${kids[$victim]}" 2>/dev/null || true; fi
    why=""
    if [ "$rc" != 1 ]; then why="exit $rc"; fi
    if ! grep -Eq "launcher: (rank $victim was frozen|rank $victim failed first)" "$out/stderr"; then
      why="$why; not named: $(grep -m1 '^launcher' "$out/stderr" || echo none)"
    fi
    sleep 0.2
    for k in "${kids[@]}"; do
      if [ -e "/proc/$k" ] && ! grep -q ') Z' "/proc/$k/stat" 2>/dev/null; then why="$why; rank pid $k left running"; fi
      if ls "/dev/shm/nccl-workbook-$k-"* >/dev/null 2>&1; then why="$why; /dev/shm files of pid $k left"; fi
    done
    limit_ms=$((timeout_s * 1000 + 3000))
    if [ "$ms" -gt "$limit_ms" ]; then why="$why; ended after $ms ms"; fi
    if [ "$ms" -gt "$worst" ]; then worst=$ms; fi
    if [ -n "$why" ]; then
      bad=$((bad + 1))
      echo "run $transport/$i: SIG$sig rank $victim after ${delay_ms} ms: ${why#; }"
    fi
    printf '%s %s %s %s %s\n' "$transport" "$sig" "$victim" "$delay_ms" "$ms" >>"$out/times"
  done
done
total=$(wc -l <"$out/times")
for sig in KILL STOP; do
  awk -v s="$sig" '$2 == s {n++; t += $5; if ($5 > m) m = $5} END {
    if (n) printf "SIG%s: %d runs, ended after %.0f ms on average, %d ms at most\n", s, n, t / n, m }' "$out/times"
done
echo "fault loop: $total runs (--timeout ${timeout_s}s), $bad failed a check; slowest end $worst ms after the signal"
[ "$bad" = 0 ]
