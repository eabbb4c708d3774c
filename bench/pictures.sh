#!/usr/bin/env bash
# The pictures in the text (docs/img/), drawn from real runs with --draw: the ring
# (chapter 5, the README), the tree (chapter 10), the grid's rows (chapter 12) and the
# overlap's timelines (chapter 14), as SVG
# (a page that steps through one, --draw FILE.html, repeats the picture once per frame:
# students make their own). Run it after changing an algorithm or the drawing; CI runs it
# again and fails if a picture changed (the text shows what runs; the timelines are
# measured, so for them CI compares what is drawn, bar for bar, not where).
# Works wherever cargo's target is (CARGO_TARGET_DIR, build.target-dir).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release --bin 02-nccl-allreduce --bin 09-nccl-split --bin 10-nccl-overlap
target=$(cargo metadata --format-version 1 --no-deps --offline | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bins=$target/release
mkdir -p docs/img

# draw NAME ENV... -- COMMAND...: docs/img/NAME.svg from one run.
draw() {
  local name=$1
  shift
  local vars=()
  while [ "$1" != -- ]; do
    vars+=("$1")
    shift
  done
  shift
  if ! out=$(env "${vars[@]}" NO_COLOR=1 "$@" --backend cpu --draw "docs/img/$name.svg" 2>&1); then
    echo "$out" >&2
    echo "bench/pictures.sh: $name: the run failed" >&2
    exit 1
  fi
  grep -q "^Drawn: " <<<"$out" || {
    echo "$out" >&2
    echo "bench/pictures.sh: $name: nothing drawn" >&2
    exit 1
  }
  echo "docs/img/$name.svg: $(grep -m 1 '^Drawn: ' <<<"$out" | sed 's/^Drawn: //; s/ written to .*//')"
}

# The ring step by step, as chapter 5 writes it (over TCP: not pipelined).
draw ring NCCL_ALGO=ring -- "$bins/02-nccl-allreduce" --nproc-per-node 4 --count 8 --init rank --transport tcp
# NCCL's double binary tree on 4 nodes of one rank, as chapter 10 runs it.
draw tree NCCL_ALGO=tree -- bash bench/nodes.sh 4 "$bins/02-nccl-allreduce" --nproc-per-node 1 --count 8
# The grid's rows: two communicators of two ranks, side by side.
draw grid NCCL_ALGO=ring -- "$bins/09-nccl-split" --nproc-per-node 4 --tp 2 --count 4 --transport tcp
# Lesson 10's four ways on two emulated nodes over 10 Gbit/s, as chapter 14 runs it.
draw overlap -- bash bench/nodes.sh 2 "$bins/10-nccl-overlap" --nproc-per-node 1 --link 50us,10Gbps
