#!/usr/bin/env bash
# The fault loop: kill -9 or SIGSTOP a random process of a job at a random moment, many
# times, and check every run against docs/failures.md:
#   - CPU backend (--cpu, the default): a 3-rank all-reduce on shm and on tcp, a rank hit;
#   - simulated GPUs (--simulate-gpus): lessons 01-06 on 2 to 4 simulated GPUs, a rank or
#     the launcher killed. (A stopped launcher is not a fault its ranks watch for: they
#     run on, as they would under a debugger; a killed one's are told to stop, SIGTERM.)
# Checked after each run: it ends (exit 1) within --timeout plus a constant (3 s; 5 s on
# simulated GPUs, whose ncclCommAbort waits up to 2 s for a lost rank), the launcher
# says one line naming the rank that was hit, no process of the job is left, and nothing
# of its processes is left in /dev/shm (nccl-workbook-PID-*, nccl-double-PID-*) or /tmp
# (nccl-workbook-PID, nccl-workbook-sim-PID), a killed launcher's included: its ranks
# remove what they, their killed peers and the launcher made before they go.
# A benchmark, not a test: CI does not run it. Every run is bounded (--timeout + 12 s
# after the signal, then the job is killed and the run counted as failed).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/fault-loop.sh [--cpu | --simulate-gpus | --all] [--runs N] [--timeout S]
                           [--debug] [--short] [RUNS [TIMEOUT]]

  --cpu             CPU backend, 3 ranks of 02-nccl-allreduce, shm then tcp (the default)
  --simulate-gpus   lessons 01-06 with --simulate-gpus 2..4; a rank is hit (SIGKILL or
                    SIGSTOP), or the launcher killed
  --all             both
  --runs N          runs per transport (cpu) or runs (simulated GPUs); default 100
  --timeout S       the jobs' --timeout in seconds; default 3
  --debug           use the debug build (target/debug) instead of --release
  --short           a quick look that ends within about 60 s once built: 3 runs per
                    transport and 5 on simulated GPUs, --timeout 2
  -h, --help        this text

Exit status 0 when every run passed every check, 1 otherwise (each failed run is one
line: what was hit, when, and which checks failed); 2 on bad arguments.
EOF
}

mode=cpu
runs=100
timeout_s=3
profile=release
short=0
positional=()
while (($#)); do
  case "$1" in
  --cpu) mode=cpu ;;
  --simulate-gpus | --sim) mode=sim ;;
  --all) mode=all ;;
  --runs) runs=${2:?--runs needs a number}; shift ;;
  --timeout) timeout_s=${2:?--timeout needs seconds}; shift ;;
  --debug) profile=debug ;;
  --short) short=1 ;;
  -h | --help) usage; exit 0 ;;
  -*) echo "fault-loop: unknown option $1 (see --help)" >&2; exit 2 ;;
  *) positional+=("$1") ;;
  esac
  shift
done
if ((${#positional[@]} > 0)); then runs=${positional[0]}; fi
if ((${#positional[@]} > 1)); then timeout_s=${positional[1]}; fi
if ((${#positional[@]} > 2)); then echo "fault-loop: too many arguments (see --help)" >&2; exit 2; fi
sim_runs=$runs
if ((short)); then runs=3; sim_runs=5; timeout_s=2; fi
for n in "$runs" "$timeout_s"; do
  if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n == 0)); then
    echo "fault-loop: '$n' is not a positive whole number (see --help)" >&2
    exit 2
  fi
done

cd "$(dirname "$0")/.."
lessons=(01-nccl-broadcast 02-nccl-allreduce 03-nccl-reduce 04-nccl-allgather 05-nccl-reducescatter 06-nccl-alltoall)
build=(cargo build --quiet)
if [ "$profile" = release ]; then build+=(--release); fi
for l in "${lessons[@]}"; do build+=(--bin "$l"); done
"${build[@]}"
bindir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/$profile
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

bad=0
worst=0

# The files that the processes PIDS... left in /dev/shm and /tmp, one name a line.
files_of() {
  local p
  for p in "$@"; do
    compgen -G "/dev/shm/nccl-workbook-$p-*" || true
    compgen -G "/dev/shm/nccl-double-$p-*" || true
    compgen -G "/tmp/nccl-workbook-$p" || true
    compgen -G "/tmp/nccl-workbook-sim-$p" || true
  done
}

# Whether process PID is there and not a zombie.
running() {
  [ -e "/proc/$1" ] && ! grep -q ') Z' "/proc/$1/stat" 2>/dev/null
}

# One run: run_one LABEL NRANKS LAUNCHER_TOO SLACK_S ARGS...: starts ARGS, hits a random
# rank (or, when LAUNCHER_TOO is 1, sometimes kills the launcher) at a random moment, and
# checks the end: within --timeout + SLACK_S seconds.
run_one() {
  local label=$1 nranks=$2 launcher_too=$3 slack_s=$4
  shift 4
  local victim sig delay_ms launcher kids=() start rc ms why="" target name
  victim=$((RANDOM % nranks))
  if ((launcher_too && RANDOM % 4 == 0)); then victim=launcher; fi
  if ((RANDOM % 2)) || [ "$victim" = launcher ]; then sig=KILL; else sig=STOP; fi
  delay_ms=$((RANDOM % 2000))
  # The shell's notices of killed jobs ("Killed") would be noise: its stderr goes nowhere
  # until this run is checked (the job's own goes to a file).
  exec 4>&2 2>/dev/null
  "$@" --timeout "$timeout_s" >"$out/stdout" 2>"$out/stderr" &
  launcher=$!
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  for _ in $(seq 300); do
    mapfile -t kids < <(tr ' ' '\n' <"/proc/$launcher/task/$launcher/children" 2>/dev/null | grep . || true)
    [ "${#kids[@]}" -ge "$nranks" ] && break
    running "$launcher" || break
    sleep 0.01
  done
  if [ "${#kids[@]}" -lt "$nranks" ]; then
    # Ended (or never started its ranks) before the signal: nothing to check but its status.
    rc=0
    wait "$launcher" || rc=$?
    exec 2>&4 4>&-
    if [ "$rc" != 0 ]; then
      bad=$((bad + 1))
      echo "run $label: exit $rc before any signal: $(head -c 300 "$out/stderr" | tr '\n' ' ')"
    fi
    return
  fi
  if [ "$victim" = launcher ]; then target=$launcher; name="the launcher"; else target=${kids[$victim]}; name="rank $victim"; fi
  start=$(date +%s%N)
  kill -s "$sig" "$target" 2>/dev/null || true
  local limit_ms=$(((timeout_s + slack_s) * 1000))
  if [ "$victim" = launcher ]; then
    # Nobody is left to report: the ranks must end by themselves, within the same bound.
    local k alive=1
    while ((alive)) && (($(date +%s%N) - start < (timeout_s + 12) * 1000000000)); do
      alive=0
      for k in "${kids[@]}"; do if running "$k"; then alive=1; fi; done
      if ((alive)); then sleep 0.05; fi
    done
    ms=$((($(date +%s%N) - start) / 1000000))
    if ((alive)); then why="$why; ranks still running ${ms} ms after the signal"; fi
  fi
  rc=0
  # Bounded: past --timeout + 12 s the job is killed and the run counted as failed.
  (
    trap - EXIT
    for ((t = 0; t < (timeout_s + 12) * 10; t++)); do
      running "$launcher" || exit 0
      sleep 0.1
    done
    kill -9 "$launcher" "${kids[@]}" 2>/dev/null
  ) &
  local guard=$!
  wait "$launcher" 2>/dev/null || rc=$?
  wait "$guard" || true
  if [ "$victim" != launcher ]; then ms=$((($(date +%s%N) - start) / 1000000)); fi
  if [ "$sig" = STOP ]; then kill -9 "$target" 2>/dev/null || true; fi
  if [ "$victim" = launcher ]; then
    [ "$rc" = 137 ] || why="$why; exit $rc"
  else
    [ "$rc" = 1 ] || why="$why; exit $rc"
    local lines
    lines=$(grep -c '^launcher' "$out/stderr" || true)
    if ! grep -Eq "^launcher: (rank $victim was frozen|rank $victim failed first)" "$out/stderr"; then
      why="$why; not named: $(grep -m1 '^launcher' "$out/stderr" || echo none)"
    elif [ "$lines" != 1 ]; then
      why="$why; $lines lines from the launcher"
    fi
  fi
  sleep 0.2
  exec 2>&4 4>&-
  local p
  for p in "$launcher" "${kids[@]}"; do
    if running "$p"; then why="$why; pid $p left running"; fi
  done
  local left
  left=$(files_of "$launcher" "${kids[@]}" | tr '\n' ' ')
  if [ -n "$left" ]; then why="$why; left: $left"; fi
  if [ "$ms" -gt "$limit_ms" ]; then why="$why; ended after $ms ms"; fi
  if [ "$ms" -gt "$worst" ]; then worst=$ms; fi
  if [ -n "$why" ]; then
    bad=$((bad + 1))
    echo "run $label: SIG$sig $name after ${delay_ms} ms: ${why#; }"
    sed 's/^/    | /' "$out/stderr" | tail -n 4 | cut -c1-240
  fi
  printf '%s %s %s %s %s\n' "${label%%/*}" "$sig" "$victim" "$delay_ms" "$ms" >>"$out/times"
}

if [ "$mode" = cpu ] || [ "$mode" = all ]; then
  for transport in shm tcp; do
    for ((i = 0; i < runs; i++)); do
      run_one "$transport/$i" 3 0 3 "$bindir/02-nccl-allreduce" --backend cpu --transport "$transport" \
        --nproc-per-node 3 --size 16M --iters 100000
    done
  done
fi
if [ "$mode" = sim ] || [ "$mode" = all ]; then
  for ((i = 0; i < sim_runs; i++)); do
    lesson=${lessons[$((RANDOM % ${#lessons[@]}))]}
    gpus=$((2 + RANDOM % 3))
    size=$((1 << (20 + RANDOM % 5))) # 1 to 16 MiB
    run_one "sim/$i ($lesson, $gpus GPUs, $((size >> 20)) MiB)" "$gpus" 1 5 "$bindir/$lesson" \
      --simulate-gpus "$gpus" --size "$size" --iters 100000
  done
fi

total=$(wc -l <"$out/times" 2>/dev/null || echo 0)
for kind in shm tcp sim; do
  for sig in KILL STOP; do
    awk -v k="$kind" -v s="$sig" '$1 == k && $2 == s {n++; t += $5; if ($5 > m) m = $5} END {
      if (n) printf "%s SIG%s: %d runs, ended after %.0f ms on average, %d ms at most\n", k, s, n, t / n, m }' \
      "$out/times" 2>/dev/null || true
  done
done
echo "fault loop: $total runs hit (--timeout ${timeout_s}s), $bad failed a check; slowest end $worst ms after the signal"
[ "$bad" = 0 ]
