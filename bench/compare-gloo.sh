#!/usr/bin/env bash
# Compare this project's collectives with torch.distributed's Gloo, side by side, in one run:
# every collective Gloo has (broadcast, reduce, all_reduce, all_gather, reduce_scatter,
# alltoall; --ops picks some). bench/compare-mpi.sh does the same against Open MPI.
#
#   bench/compare-gloo.sh --setup        # once: create bench/.venv and pip install torch numpy
#   bench/compare-gloo.sh                # the comparison (several minutes; --scaling adds more)
#   bench/compare-gloo.sh --scaling --json /tmp/compare.json
#   bench/compare-gloo.sh --save-results /tmp/gloo   # + each run as a 07-nccl-perf result, to plot:
#   cargo run --release -q --bin 07-nccl-perf -- --plot gloo.png --no-run \
#       --plot-with /tmp/gloo/gloo-all_reduce-2ranks.json --plot-with /tmp/gloo/ours-all_reduce-2ranks.json
#   bench/compare-gloo.sh --help         # every option (they are gloo_bench.py's)
#
# This script only prepares: the Python environment, the release build, the variables Gloo
# needs. bench/gloo_bench.py does the measuring and prints the tables. It is a benchmark, not
# a test: it never runs in CI, and its numbers mean something only on a quiet machine.
set -euo pipefail

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(dirname "$bench_dir")
venv="$bench_dir/.venv"
python="$venv/bin/python"

# The exact command, as the report's header shows it: plain words as they are, the others
# quoted so that the line can be pasted back into a shell.
command_line="bench/compare-gloo.sh"
for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./,:=+-]+$ ]]; then
        command_line+=" $arg"
    else
        command_line+=" $(printf '%q' "$arg")"
    fi
done

setup=false
build=true
help=false
pass=()
for arg in "$@"; do
    case "$arg" in
        --setup) setup=true ;;
        # Nothing of ours to build: only Gloo is measured, or only the options are shown.
        --gloo-only) build=false; pass+=("$arg") ;;
        -h | --help) help=true; build=false; pass+=("$arg") ;;
        --no-build) build=false ;;
        *) pass+=("$arg") ;;
    esac
done

if $setup; then
    # torch from PyPI brings the CUDA wheels too (several GB): only the CPU part is used here.
    echo "setup: creating $venv and installing torch and numpy from PyPI (several GB, a few minutes)"
    python3 -m venv "$venv"
    start=$SECONDS
    "$python" -m pip install --quiet torch numpy
    echo "setup: installed in $((SECONDS - start)) s; $(du -sh "$venv" | cut -f1) in $venv"
    "$python" -c 'import torch, numpy; print("setup: torch", torch.__version__, "numpy", numpy.__version__)'
    echo "setup: done; now run bench/compare-gloo.sh (without --setup)"
    exit 0
fi

if [[ ! -x "$python" ]]; then
    if $help; then
        exec python3 "$bench_dir/gloo_bench.py" --help  # showing the options needs no torch
    fi
    echo "compare-gloo: no Python environment at bench/.venv: run bench/compare-gloo.sh --setup first" >&2
    exit 2
fi

cd "$repo_dir"
if $build; then
    # Always ask cargo: it does nothing when the binaries are up to date, and rebuilds them
    # when a source changed, so the comparison never measures a stale binary. (nice: the
    # build runs before any timing, but need not slow whatever else the machine is doing.)
    echo "compare-gloo: cargo build --release --bin 07-nccl-perf --bin 00-nccl-hello-world" >&2
    if ! nice -n 19 cargo build --quiet --release --bin 07-nccl-perf --bin 00-nccl-hello-world; then
        echo "compare-gloo: the build failed (above); --gloo-only measures Gloo alone" >&2
        exit 1
    fi
fi

# Gloo over loopback, one thread per rank: the same settings as the baseline
# (shared/notes/baseline.md), so that Gloo's numbers can be checked against it.
export GLOO_SOCKET_IFNAME=lo
export OMP_NUM_THREADS=1
export BENCH_COMMAND="$command_line"
exec "$python" "$bench_dir/gloo_bench.py" --repo "$repo_dir" "${pass[@]}"
