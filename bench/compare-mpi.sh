#!/usr/bin/env bash
# Compare this project's collectives with Open MPI's, side by side, in one run.
#
#   bench/compare-mpi.sh                         # every collective, 4 B, 1 MiB, 100 MiB, 2 and 4 ranks
#   bench/compare-mpi.sh --sizes 4,64K --nproc 2 -n 3 --json /tmp/mpi.json
#   bench/compare-mpi.sh --sizes 4,1K,64K,1M,16M --save-results /tmp/mpi   # then, to plot:
#   cargo run --release -q --bin 07-nccl-perf -- --plot mpi.png --no-run \
#       --plot-with /tmp/mpi/mpi-all_reduce-2ranks.json --plot-with /tmp/mpi/ours-all_reduce-2ranks.json
#   bench/compare-mpi.sh --help
#
# It installs Debian's Open MPI (openmpi-bin, libopenmpi-dev) if mpicc or mpirun is missing,
# builds bench/mpi_bench.c and bench/floors.c into bench/build/, builds 07-nccl-perf (cargo),
# then measures the machine's limits (a cache-line round trip between two processes, memcpy
# with 1 and 2 threads), the CPU time of a rank kept waiting 10 s, and, for every rank
# count, collective and size, --repeat times each: ours (07-nccl-perf --backend cpu, in place
# and out of place) and Open MPI's same collective (bench/mpi_bench.c). It prints the limits
# and one markdown table per rank count, each time the median of the repeats. It is a
# benchmark, not a test: CI never runs it, and its numbers mean something only on a quiet
# machine.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: bench/compare-mpi.sh [options]

Ours (07-nccl-perf --backend cpu) against Open MPI (mpirun --oversubscribe -np N, its
default transports: shared memory between ranks of one host), on the same sizes, rank
counts and iterations, float32, sum, root 0:

  broadcast       MPI_Bcast                busbw = algbw        (one buffer: in place only)
  reduce          MPI_Reduce               busbw = algbw
  all_reduce      MPI_Allreduce            busbw = algbw x 2(n-1)/n
  all_gather      MPI_Allgather            busbw = algbw x (n-1)/n
  reduce_scatter  MPI_Reduce_scatter_block busbw = algbw x (n-1)/n
  alltoall        MPI_Alltoall             busbw = algbw x (n-1)/n

algbw = size / time per operation (GB/s = 1e9 B/s); a size is nccl-tests' size, the bytes
of the larger buffer, rounded as 07-nccl-perf rounds it (a whole number of floats per rank
where the buffer is split among the ranks). In place is MPI_IN_PLACE on Open MPI's side.
Both sides: one checked operation, the warm-up, a barrier, the timed operations; time =
mean over ranks of (loop time / iterations); each point is the median of --repeat runs,
the two sides alternating, and the time column gives each side's lowest and highest run
beside its median. Each busbw is also given as a percentage of the single-thread
memcpy bandwidth that 07-nccl-perf measures (median over its runs).

Where the machine's cores sit: before and after every run of either side, a quick
cache-line round trip (bench/build/floors --round-trip, a few milliseconds). On a VM the
host may move the vCPUs from minute to minute, and a round trip of 100 ns in one run and
500 ns in the next changes a small message's time more than either library does. Each
row gives the median round trip during each side's runs, and marks with * a row whose two
sides ran at round trips more than 1.5x apart: its ratio says where the cores were as
much as which library is faster.

The limits (bench/floors.c): a cache-line round trip between two processes (the floor of
a 2-rank 4 B all-reduce: each rank must see the other's bytes), and memcpy with 1 and 2
threads in memory (100 MiB each) and in cache (256 KiB each). Ours is given as a multiple
of the round trip at the smallest size, and as a fraction of each memcpy at the largest.
Then 07-nccl-perf on 2 ranks with rank 1 held 10 s before its first all-reduce
(NCCL_WORKBOOK_FAULT=late:1:10000): the CPU time the job used while rank 0 waited.

Options:
  --sizes LIST        sizes in bytes, K/M/G binary (default 4,1M,100M)
  --nproc LIST        rank counts (default 2,4)
  --ops LIST          collectives (default broadcast,reduce,all_reduce,all_gather,
                      reduce_scatter,alltoall)
  -n, --iters N       timed operations per size (default: by size, 256 MiB / size,
                      at least 10, at most 1000: 4 B 1000, 1 MiB 256, 100 MiB 10)
  -w, --warmup N      warm-up operations per size (default: iterations / 10, at least 2)
  --repeat R          runs of each side per point, the median kept (default 3)
  --json FILE         also write the results as JSON
  --save-results DIR  also write each side's runs as 07-nccl-perf results, one file per
                      collective and rank count (DIR/mpi-all_reduce-2ranks.json,
                      DIR/ours-all_reduce-2ranks.json), to draw with 07-nccl-perf --plot
                      FILE.png --plot-with ... --no-run
  --mpirun-args STR   more arguments for mpirun (split on spaces), e.g. "--bind-to none"
  --timeout S         seconds any one launch may take (default 600)
  --busy N            run N busy programs (yes > /dev/null) beside every measurement, as
                      on a machine that another job keeps busy (default 0)
  --no-build          do not run cargo build (use the built 07-nccl-perf as it is)
  -h, --help          this help
EOF
}

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(dirname "$bench_dir")
build_dir="$bench_dir/build"
exe="$build_dir/mpi_bench"
# cargo's target folder, wherever it is (CARGO_TARGET_DIR, build.target-dir).
target_dir=$(cd "$repo_dir" && cargo metadata --format-version 1 --no-deps --offline 2>/dev/null |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
perf_bin="${target_dir:-$repo_dir/target}/release/07-nccl-perf"

command_line="bench/compare-mpi.sh"
for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./,:=+-]+$ ]]; then
        command_line+=" $arg"
    else
        command_line+=" $(printf '%q' "$arg")"
    fi
done

die() {
    echo "compare-mpi: $*" >&2
    exit 2
}
log() { echo "compare-mpi: $*" >&2; }

sizes_arg="4,1M,100M"
nproc_arg="2,4"
ops_arg="broadcast,reduce,all_reduce,all_gather,reduce_scatter,alltoall"
iters_arg=auto
warmup_arg=auto
json=""
save_results=""
mpirun_args=""
timeout_s=600
repeat=3
busy=0
build=true
while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --sizes | --nproc | --ops | -n | --iters | -w | --warmup | --json | --save-results | --mpirun-args | --timeout | --repeat | --busy)
            (($# >= 2)) || die "$1 needs a value (see --help)"
            case "$1" in
                --sizes) sizes_arg=$2 ;;
                --nproc) nproc_arg=$2 ;;
                --ops) ops_arg=$2 ;;
                -n | --iters) iters_arg=$2 ;;
                -w | --warmup) warmup_arg=$2 ;;
                --json) json=$2 ;;
                --save-results) save_results=$2 ;;
                --mpirun-args) mpirun_args=$2 ;;
                --timeout) timeout_s=$2 ;;
                --repeat) repeat=$2 ;;
                --busy) busy=$2 ;;
            esac
            shift 2 ;;
        --no-build) build=false; shift ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

# "64K" -> 65536 (K, M, G binary, as our binaries read them; an optional B or iB).
to_bytes() {
    local text=${1^^} scale=1
    [[ "$text" =~ ^([0-9]+)([KMG]?)(I?B)?$ ]] || die "'$1' is not a size (examples: 4, 64K, 1M, 100M)"
    case "${BASH_REMATCH[2]}" in
        K) scale=1024 ;;
        M) scale=$((1024 * 1024)) ;;
        G) scale=$((1024 * 1024 * 1024)) ;;
    esac
    local bytes=$((10#${BASH_REMATCH[1]} * scale))
    ((bytes > 0 && bytes % 4 == 0)) || die "'$1': a size must be a positive multiple of 4 (float32)"
    echo "$bytes"
}

all_ops=(broadcast reduce all_reduce all_gather reduce_scatter alltoall)
IFS=, read -ra size_words <<<"$sizes_arg"
IFS=, read -ra nprocs <<<"$nproc_arg"
IFS=, read -ra ops <<<"${ops_arg//-/_}"
sizes=()
for word in "${size_words[@]}"; do sizes+=("$(to_bytes "$word")"); done
mapfile -t sizes < <(printf '%s\n' "${sizes[@]}" | sort -n -u)
((${#sizes[@]})) || die "--sizes: no size given"
((${#nprocs[@]})) || die "--nproc: no rank count given"
for n in "${nprocs[@]}"; do
    if [[ ! "$n" =~ ^[0-9]+$ ]] || ((n < 2)); then
        die "--nproc: '$n' is not a rank count of 2 or more"
    fi
done
((${#ops[@]})) || die "--ops: no collective given"
for op in "${ops[@]}"; do
    [[ " ${all_ops[*]} " == *" $op "* ]] || die "--ops: '$op' is not one of ${all_ops[*]}"
done
for value in "$iters_arg" "$warmup_arg"; do
    [[ "$value" == auto || "$value" =~ ^[0-9]+$ ]] || die "-n and -w take a number ('$value')"
done
[[ "$iters_arg" == auto ]] || ((iters_arg >= 1)) || die "-n must be at least 1"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout takes whole seconds ('$timeout_s')"
if [[ ! "$repeat" =~ ^[0-9]+$ ]] || ((repeat < 1)); then
    die "--repeat takes a number of runs, 1 or more ('$repeat')"
fi
if [[ ! "$busy" =~ ^[0-9]+$ ]] || ((busy > 256)); then
    die "--busy takes a number of busy programs, 0 to 256 ('$busy')"
fi
read -ra extra_mpirun <<<"$mpirun_args"

# The size both sides measure: nccl-tests' size rounded as 07-nccl-perf rounds it, a whole
# number of floats per rank where the buffer is split among the ranks (at least one).
op_size() { # op n bytes
    local per=1 elements
    case "$1" in all_gather | reduce_scatter | alltoall) per=$2 ;; esac
    elements=$(($3 / 4 / per))
    ((elements >= 1)) || elements=1
    echo $((elements * per * 4))
}
iters_for() { # bytes
    if [[ "$iters_arg" != auto ]]; then echo "$iters_arg"; return; fi
    local n=$((256 * 1024 * 1024 / $1))
    ((n < 10)) && n=10
    ((n > 1000)) && n=1000
    echo "$n"
}
warmup_for() { # bytes
    if [[ "$warmup_arg" != auto ]]; then echo "$warmup_arg"; return; fi
    local w=$(($(iters_for "$1") / 10))
    ((w < 2)) && w=2
    echo "$w"
}

# --- Open MPI: install it if needed, build the C program --------------------------------

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    sudo=()
    if (($(id -u) != 0)); then
        command -v sudo >/dev/null || die "mpicc/mpirun missing, and no sudo to install Open MPI: apt-get install openmpi-bin libopenmpi-dev"
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null || die "mpicc/mpirun missing and no apt-get: install Open MPI (mpicc, mpirun) yourself"
    log "mpicc or mpirun missing: installing Debian's Open MPI: apt-get install -y openmpi-bin libopenmpi-dev"
    # apt's output to stderr: stdout holds only the report.
    "${sudo[@]}" apt-get update -q >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev >&2
fi
command -v python3 >/dev/null || die "python3 is needed to read the results and print the tables"

mkdir -p "$build_dir"
log "mpicc -O2 -o bench/build/mpi_bench bench/mpi_bench.c"
mpicc -O2 -Wall -Wextra -o "$exe" "$bench_dir/mpi_bench.c"
log "cc -O2 -pthread -o bench/build/floors bench/floors.c"
mpicc -O2 -Wall -Wextra -pthread -o "$build_dir/floors" "$bench_dir/floors.c"

cd "$repo_dir"
if $build; then
    log "cargo build --release --bin 07-nccl-perf"
    nice -n 19 cargo build --quiet --release --bin 07-nccl-perf || die "the build failed (above)"
fi
[[ -x "$perf_bin" ]] || die "$perf_bin is missing: build it (without --no-build)"

# Variables through which a rank learns its place (torchrun, Slurm): our binary reads them
# too, and mpirun would take a Slurm allocation for its own; both run as one job here.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT
while read -r name; do unset "$name"; done < <(compgen -e | grep -E '^(SLURM_|TORCHELASTIC_)' || true)

# --- The measurements -------------------------------------------------------------------

work=$(mktemp -d)
busy_pids=()
trap '((${#busy_pids[@]})) && kill "${busy_pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
manifest="$work/manifest"
: >"$manifest"
mpirun_cmd=(mpirun --oversubscribe --allow-run-as-root)

failed() { # what file-with-stderr
    echo "compare-mpi: $1 failed:" >&2
    tail -n 20 "$2" | sed 's/^/    /' >&2
    exit 1
}

# Both programs exit with 1 when an element was wrong, after their JSON: that is a result
# (the table says WRONG), not a failure of the run.
wrong_only() { # status json-file
    (($1 == 1)) && grep -q '"wrong": [1-9]' "$2"
}

# A cache-line round trip between two processes now, in ns: where the cores sit.
round_trip() {
    timeout 60 "$build_dir/floors" --round-trip || die "bench/build/floors --round-trip failed"
}

run_ours() { # op n repeat
    local op=$1 n=$2 rep=$3 size bytes iters warmup out status before after
    for size in "${sizes[@]}"; do
        bytes=$(op_size "$op" "$n" "$size")
        iters=$(iters_for "$size") warmup=$(warmup_for "$size")
        out="$work/ours-$op-$n-$bytes-$rep.json"
        status=0
        before=$(round_trip)
        timeout "$timeout_s" "$perf_bin" --backend cpu --nproc-per-node "$n" --coll "$op" \
            -b "$bytes" -e "$bytes" -w "$warmup" -n "$iters" --format json \
            >"$out" 2>"$work/stderr" || status=$?
        if ((status != 0)) && ! wrong_only "$status" "$out"; then
            failed "07-nccl-perf --coll $op -b $bytes --nproc-per-node $n (exit status $status)" "$work/stderr"
        fi
        after=$(round_trip)
        echo "ours $op $n $bytes $iters $warmup $out $before,$after" >>"$manifest"
    done
}

run_mpi() { # op n repeat
    local op=$1 n=$2 rep=$3 size bytes list_sizes="" list_iters="" list_warmup="" out status=0 before after
    for size in "${sizes[@]}"; do
        bytes=$(op_size "$op" "$n" "$size")
        list_sizes+=",$bytes" list_iters+=",$(iters_for "$size")" list_warmup+=",$(warmup_for "$size")"
    done
    out="$work/mpi-$op-$n-$rep.json"
    before=$(round_trip)
    timeout "$timeout_s" "${mpirun_cmd[@]}" -np "$n" "${extra_mpirun[@]}" "$exe" "$op" \
        "${list_sizes#,}" "${list_iters#,}" "${list_warmup#,}" >"$out" 2>"$work/stderr" || status=$?
    if ((status != 0)) && ! wrong_only "$status" "$out"; then
        failed "mpirun -np $n mpi_bench $op (exit status $status)" "$work/stderr"
    fi
    after=$(round_trip)
    echo "mpi $op $n - - - $out $before,$after" >>"$manifest"
}

loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
start=$SECONDS

# A machine that another job keeps busy: programs that compute and never wait, on cores
# that the ranks of both sides share with them. Each `yes` has a watcher, which ends it
# when told to (TERM) or, within a second, when this script is gone however it ended.
start_busy() {
    local script=$$
    (
        yes >/dev/null &
        local hog=$!
        trap 'kill "$hog" 2>/dev/null; exit 0' TERM
        while kill -0 "$script" 2>/dev/null; do
            sleep 1 &
            wait $! || true
        done
        kill "$hog" 2>/dev/null || true
    ) &
    busy_pids+=($!)
}
for ((b = 0; b < busy; b++)); do start_busy; done
((busy == 0)) || log "busy programs (yes > /dev/null) beside the measurements: $busy"

# The machine's limits, and how much CPU a rank kept waiting uses.
log "the machine's limits: bench/build/floors"
"$build_dir/floors" >"$work/floors.json" || die "bench/build/floors failed"
log "CPU time of a 2-rank job whose rank 1 starts its all-reduce 10 s late"
idle_start=$SECONDS
TIMEFORMAT='%U %S %R'
{ time NCCL_WORKBOOK_FAULT=late:1:10000 timeout "$timeout_s" "$perf_bin" --backend cpu \
    --nproc-per-node 2 --coll all_reduce -b 4 -e 4 -w 0 -n 1 --format json >/dev/null 2>"$work/stderr"; } \
    2>"$work/idle-time" || failed "07-nccl-perf with rank 1 held 10 s" "$work/stderr"
unset TIMEFORMAT
log "  ($((SECONDS - idle_start)) s)"

i=0
for ((r = 1; r <= repeat; r++)); do
    for n in "${nprocs[@]}"; do
        for op in "${ops[@]}"; do
            # The two sides in alternating order, so that a drift of the machine (another
            # job, the clock) falls on both alike.
            if ((i % 2 == 0)); then
                log "run $r of $repeat: $op, $n ranks: ours, then Open MPI"
                run_ours "$op" "$n" "$r"
                run_mpi "$op" "$n" "$r"
            else
                log "run $r of $repeat: $op, $n ranks: Open MPI, then ours"
                run_mpi "$op" "$n" "$r"
                run_ours "$op" "$n" "$r"
            fi
            i=$((i + 1))
        done
    done
done
log "measured in $((SECONDS - start)) s"
if ((${#busy_pids[@]})); then
    kill "${busy_pids[@]}" 2>/dev/null || true
    busy_pids=()
fi

# --- The report -------------------------------------------------------------------------

iter_lines=()
for size in "${sizes[@]}"; do
    iter_lines+=("$size:$(iters_for "$size"):$(warmup_for "$size")")
done
export CMP_COMMAND="$command_line" CMP_LOADAVG="$loadavg" CMP_JSON="$json" CMP_SAVE="$save_results"
export CMP_FLOORS="$work/floors.json" CMP_IDLE="$work/idle-time" CMP_REPEAT="$repeat" CMP_BUSY="$busy"
export CMP_ITERS="${iter_lines[*]}" CMP_ITERS_AUTO="$iters_arg" CMP_WARMUP_AUTO="$warmup_arg" CMP_MPIRUN="${mpirun_cmd[*]} -np N${extra_mpirun[*]:+ ${extra_mpirun[*]}}"
CMP_MPI_VERSION=$(mpirun --version 2>/dev/null | head -n 1)
# Which transport Open MPI chose by default: its PML (ob1 moves messages through BTLs, vader
# being the shared-memory one; ucx would bring its own), from one tiny verbose run.
pml=$(timeout 60 "${mpirun_cmd[@]}" -np 2 "${extra_mpirun[@]}" --mca pml_base_verbose 10 "$exe" \
    all_reduce 4 1 0 2>&1 | sed -n 's/.*select: component \([a-z0-9]*\) selected.*/\1/p' | head -n 1 || true)
CMP_TRANSPORT="pml ${pml:-unknown}"
if [[ "$pml" == ob1 ]]; then
    copy=$(ompi_info --param btl vader --level 9 2>/dev/null |
        sed -n 's/.*btl_vader_single_copy_mechanism" (current value: "\([^"]*\)".*/\1/p' | head -n 1 || true)
    CMP_TRANSPORT+=", btl vader (shared memory; single copy: ${copy:-unknown})"
fi
export CMP_TRANSPORT
CMP_GIT=$(git -C "$repo_dir" describe --always --dirty 2>/dev/null || echo unknown)
export CMP_MPI_VERSION CMP_GIT
python3 - "$manifest" <<'PY'
import datetime, json, math, os, socket, statistics, sys

MiB = 1024 * 1024
SPLIT = ("all_gather", "reduce_scatter", "alltoall")


def bus_factor(op, n):
    if op == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n if op in SPLIT else 1.0


def fmt_size(size):
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", MiB), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def sig(v, digits=3):
    """3 significant digits, never in exponent form: 5.09, 0.0409, 0.000123."""
    if v is None:
        return "-"
    if v == 0:
        return "0"
    places = max(0, min(9, digits - 1 - math.floor(math.log10(abs(v)))))
    return f"{v:.{places}f}"


def ratio(v):
    return "-" if v is None else (f"{v:.0f}x" if v >= 100 else f"{v:.3g}x")


def pair(a, b, f):
    return f"{f(a)} / {f(b)}"


def spread(p):
    """A side's median time and, over several runs, its lowest and highest: 0.126 (0.084-0.184).
    On a noisy machine the range says how far one run's figure can be trusted."""
    if p is None:
        return "-"
    low, high = p["time_us_range"]
    return sig(p["time_us"]) if low == high else f"{sig(p['time_us'])} ({sig(low)}-{sig(high)})"


def load(path):
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text[text.index("{"):])
    except ValueError as e:
        sys.exit(f"compare-mpi: {path}: no JSON document ({e}); it began with:\n{text[:400]}")


def place(doc_place, op, n, size):
    """A measurement as both sides have it: time, and bandwidths from one formula."""
    if doc_place is None:
        return None
    t = doc_place["time_us"]
    algbw = size / 1e3 / t
    return {"time_us": t, "algbw": algbw, "busbw": algbw * bus_factor(op, n),
            "wrong": int(doc_place["wrong"] or 0),
            "time_us_range": doc_place.get("time_us_range", [t, t])}


def merged(docs, op, n):
    """One document from --repeat runs of one side: each row's times the median of the
    runs' (bandwidths from that median) and their lowest and highest, its wrong elements
    the sum."""
    doc = dict(docs[0])
    rows = {}
    for d in docs:
        for r in d["rows"]:
            rows.setdefault(r["size"], []).append(r)
    out = []
    for size in sorted(rows):
        runs = rows[size]
        row = dict(runs[0])
        for p in ("in_place", "out_of_place"):
            if runs[0].get(p) is None:
                continue
            times = [r[p]["time_us"] for r in runs]
            t = statistics.median(times)
            algbw = size / 1e3 / t
            row[p] = {"time_us": t, "algbw": algbw, "busbw": algbw * bus_factor(op, n),
                      "wrong": sum(int(r[p]["wrong"] or 0) for r in runs),
                      "time_us_range": [min(times), max(times)]}
        out.append(row)
    doc["rows"] = out
    return doc


ours, mpi, order, memcpy = {}, {}, [], []
runs_ours, runs_mpi = {}, {}  # each side's documents per (op, n), every repeat
# The round trips (ns) taken before and after each run: ours per (op, n, size), Open MPI's
# per (op, n) (one launch runs every size).
trips_ours, trips_mpi = {}, {}
with open(sys.argv[1]) as f:
    for line in f:
        side, op, n, size, iters, warmup, path, trips = line.split()
        n, doc, trips = int(n), load(path), [float(t) for t in trips.split(",")]
        if side == "ours":
            size = int(size)
            trips_ours.setdefault((op, n, size), []).extend(trips)
            if doc.get("op", "").replace("-", "_") != op or doc.get("world_size") != n \
                    or not any(r["size"] == size for r in doc["rows"]):
                sys.exit(f"compare-mpi: 07-nccl-perf's JSON for {op} N={n} has no row of {size} bytes")
            memcpy.append(doc["memcpy_gbps"])
            runs_ours.setdefault((op, n), []).append(doc)
            if (op, n, size) not in ours:
                order.append((op, n, size))
            ours[(op, n, size)] = {"iters": int(iters), "warmup": int(warmup)}
        else:
            if doc.get("op") != op or doc.get("world_size") != n:
                sys.exit(f"compare-mpi: mpi_bench's JSON for {op} N={n} is for another run")
            runs_mpi.setdefault((op, n), []).append(doc)
            trips_mpi.setdefault((op, n), []).extend(trips)

docs_ours = {key: merged(docs, *key) for key, docs in runs_ours.items()}
docs_mpi = {key: merged(docs, *key) for key, docs in runs_mpi.items()}
for (op, n), doc in docs_ours.items():
    for r in doc["rows"]:
        if (op, n, r["size"]) in ours:
            ours[(op, n, r["size"])].update({p: place(r.get(p), op, n, r["size"])
                                             for p in ("in_place", "out_of_place")})
for (op, n), doc in docs_mpi.items():
    for r in doc["rows"]:
        mpi[(op, n, r["size"])] = {"call": doc["call"], "library": doc["library"],
                                   **{p: place(r.get(p), op, n, r["size"])
                                      for p in ("in_place", "out_of_place")}}

ref = statistics.median(memcpy)
results = []
for key in order:
    op, n, size = key
    o, m = ours[key], mpi.get(key)
    if m is None:
        sys.exit(f"compare-mpi: no Open MPI result for {op} N={n} {size} bytes")
    res = {"op": op, "call": m["call"], "world_size": n, "size": size, "iters": o["iters"],
           "warmup": o["warmup"], "ours": {p: o[p] for p in ("in_place", "out_of_place")},
           "mpi": {p: m[p] for p in ("in_place", "out_of_place")}, "ratio": {},
           "percent_of_memcpy": {}}
    for p in ("in_place", "out_of_place"):
        res["ratio"][p] = o[p]["busbw"] / m[p]["busbw"] if m[p] else None
        res["percent_of_memcpy"][p] = 100 * o[p]["busbw"] / ref
    res["wrong"] = {"ours": o["in_place"]["wrong"] + o["out_of_place"]["wrong"],
                    "mpi": sum(m[p]["wrong"] for p in ("in_place", "out_of_place") if m[p])}
    res["round_trip_ns"] = {"ours": trips_ours[key], "mpi": trips_mpi[(op, n)]}
    results.append(res)

env = os.environ
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           "unknown CPU")
iters = [w.split(":") for w in env["CMP_ITERS"].split()]
header = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "command": env["CMP_COMMAND"], "cpu": cpu, "nproc": len(os.sched_getaffinity(0)),
          "loadavg": env["CMP_LOADAVG"], "git": env["CMP_GIT"],
          "mpi": env["CMP_MPI_VERSION"], "mpi_library": next(iter(mpi.values()))["library"],
          "mpirun": env["CMP_MPIRUN"], "mpi_transport": env["CMP_TRANSPORT"],
          "iterations": {int(s): {"iters": int(i), "warmup": int(w)} for s, i, w in iters},
          "memcpy_gbps": {"median": ref, "min": min(memcpy), "max": max(memcpy),
                          "runs": len(memcpy)}}

with open(env["CMP_FLOORS"]) as f:
    floors = json.load(f)
user, system, wall = (float(v) for v in open(env["CMP_IDLE"]).read().split())
header["floors"] = floors
header["held_10s"] = {"cpu_s": user + system, "user_s": user, "system_s": system, "wall_s": wall}
header["repeat"] = int(env["CMP_REPEAT"])
header["busy"] = int(env["CMP_BUSY"])
rt = floors["round_trip_ns"] / 1e3
mem, cache = floors["memcpy_gbps"]["in_memory"], floors["memcpy_gbps"]["in_cache"]

out = [f"# compare-mpi: {header['date']}, nproc {header['nproc']}, {cpu}, {header['mpi']}", "",
       f"Command: `{header['command']}`  ",
       f"Repository at {header['git']}; load average at start {header['loadavg']}; "
       + (f"{header['busy']} busy program{'s' if header['busy'] > 1 else ''} (`yes > /dev/null`) "
          "beside every measurement; "
          if header["busy"] else "") + "Open MPI "
       f"through `{header['mpirun']}`, its default transport: {header['mpi_transport']}.  ",
       "Per size, both sides: " + ", ".join(
           f"{fmt_size(s)} {v['iters']} timed + {v['warmup']} warm-up"
           for s, v in header["iterations"].items())
       + " (timed: " + ("-n" if env["CMP_ITERS_AUTO"] != "auto" else "256 MiB / size, 10 to 1000")
       + "; warm-up: " + ("-w" if env["CMP_WARMUP_AUTO"] != "auto" else "a tenth of them, at least 2")
       + "; a rounded size takes its requested size's counts).  ",
       f"memcpy, 1 thread (07-nccl-perf's header, 100 MiB): {ref:.2f} GB/s, median of "
       f"{len(memcpy)} runs ({min(memcpy):.2f} to {max(memcpy):.2f}); sizes that fit in the "
       "caches can exceed 100% of it.  ",
       "busbw in GB/s (1e9 B/s), nccl-tests' formulas on both sides; each pair is in place / "
       "out of place (Open MPI: MPI_IN_PLACE; MPI_Bcast has one buffer, so in place only). "
       "Ratio: our busbw / Open MPI's, same placement. Every figure is the median of "
       f"{header['repeat']} runs of each side.", "",
       "## The machine's limits (bench/floors.c)", "",
       f"- a cache-line round trip between two processes: {rt * 1e3:.0f} ns (one way: about "
       f"{rt * 5e2:.0f} ns)",
       f"- memcpy in memory (100 MiB per thread): {mem['1']:.1f} GB/s with 1 thread, "
       f"{mem['2']:.1f} GB/s with 2",
       f"- memcpy in cache (256 KiB per thread): {cache['1']:.1f} GB/s with 1 thread, "
       f"{cache['2']:.1f} GB/s with 2",
       f"- 2 ranks, rank 1 starting its all-reduce 10 s late: the job used "
       f"{user + system:.2f} s of CPU ({user:.2f} user, {system:.2f} system) in {wall:.1f} s", ""]
for n in dict.fromkeys(k[1] for k in order):
    for op in dict.fromkeys(k[0] for k in order):
        keys = [k for k in order if k[:2] == (op, n)]
        if not keys:
            continue
        small, large = min(keys, key=lambda k: k[2]), max(keys, key=lambda k: k[2])
        o, l = ours[small]["in_place"], ours[large]["in_place"]
        out.append(f"- {op}, {n} ranks, in place: {fmt_size(small[2])} in {o['time_us']:.2f} us = "
                   f"{o['time_us'] / rt:.2f} round trips; {fmt_size(large[2])} at "
                   f"{l['busbw']:.2f} GB/s busbw = {100 * l['busbw'] / mem['1']:.0f}% of memcpy "
                   f"with 1 thread, {100 * l['busbw'] / mem['2']:.0f}% with 2")
out.append("")
for n in dict.fromkeys(r["world_size"] for r in results):
    out += [f"## {n} ranks", "",
            "| collective | size | ours busbw (in / out of place) | Open MPI busbw (in / out) "
            "| ratio ours/MPI (in / out) | ours % of memcpy (in / out) "
            "| time us in place, median (lowest-highest): ours / MPI "
            "| round trip ns: ours / MPI | correct |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    apart = 0
    for r in results:
        if r["world_size"] != n:
            continue
        o, m = r["ours"], r["mpi"]
        busbw = lambda p: None if p is None else p["busbw"]
        pct = lambda v: f"{sig(v)}%"
        ok = "OK" if not r["wrong"]["ours"] and not r["wrong"]["mpi"] else \
            f"WRONG (ours {r['wrong']['ours']}, MPI {r['wrong']['mpi']})"
        ot, mt = (statistics.median(r["round_trip_ns"][s]) for s in ("ours", "mpi"))
        mark = " *" if max(ot, mt) > 1.5 * min(ot, mt) else ""
        apart += bool(mark)
        out.append(f"| {r['op']} ({r['call']}) | {fmt_size(r['size'])} "
                   f"| {pair(busbw(o['in_place']), busbw(o['out_of_place']), sig)} "
                   f"| {pair(busbw(m['in_place']), busbw(m['out_of_place']), sig)} "
                   f"| {pair(r['ratio']['in_place'], r['ratio']['out_of_place'], ratio)} "
                   f"| {pair(r['percent_of_memcpy']['in_place'], r['percent_of_memcpy']['out_of_place'], pct)} "
                   f"| {spread(o['in_place'])} / {spread(m['in_place'])} "
                   f"| {ot:.0f} / {mt:.0f}{mark} | {ok} |")
    if apart:
        out.append("")
        out.append(f"\\* {apart} row(s) whose two sides ran at round trips more than 1.5x apart (the "
                   "median over each side's runs): the host had placed the cores differently, "
                   "which moves a small message's time more than either library does.")
    out.append("")
print("\n".join(out).rstrip())
if env["CMP_JSON"]:
    with open(env["CMP_JSON"], "w") as f:
        json.dump({"header": header, "results": results}, f, indent=1)
        f.write("\n")
    print(f"compare-mpi: JSON written to {env['CMP_JSON']}", file=sys.stderr)
if env["CMP_SAVE"]:
    # 07-nccl-perf's result form (--format json), one file per side, collective and rank
    # count: ours gathered from its one-size runs, each time the median of the repeats.
    os.makedirs(env["CMP_SAVE"], exist_ok=True)
    saved = []
    for (op, n), doc in docs_ours.items():
        doc = dict(doc)
        doc.pop("avg_busbw", None)
        saved.append((f"ours-{op}-{n}ranks.json", doc))
    for (op, n), doc in docs_mpi.items():
        doc = dict(doc, backend="mpi", host=socket.gethostname())
        if "vader" in env["CMP_TRANSPORT"]:
            doc["transport"] = "shm"
        saved.append((f"mpi-{op}-{n}ranks.json", doc))
    for name, doc in saved:
        with open(os.path.join(env["CMP_SAVE"], name), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    print(f"compare-mpi: {len(saved)} results written to {env['CMP_SAVE']}/ (draw them: "
          "07-nccl-perf --plot FILE.png --plot-with ... --no-run)", file=sys.stderr)
wrong = any(r["wrong"]["ours"] or r["wrong"]["mpi"] for r in results)
if wrong:
    print("compare-mpi: some results were WRONG: their timings mean nothing", file=sys.stderr)
sys.exit(1 if wrong else 0)
PY
