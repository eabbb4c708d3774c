#!/usr/bin/env bash
# Runs bench/nccl-env.c over a table of NCCL_ALGO and NCCL_PROTO values and prints one
# line each: what NCCL's init, one all-reduce and one broadcast said (one rank, one GPU).
# On a GPU node:            bench/nccl-env.sh
# On the test double here:  bench/nccl-env.sh --double 22803   (the version it plays)
# The two outputs, set side by side, say whether the double reads the variables as the
# NCCL it plays does (docs/gpu-runs.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O1 -o "$tmp/nccl-env" "$here/nccl-env.c" -ldl
if [[ ${1:-} == --double ]]; then
  version=${2:?--double needs the NCCL version code to play, e.g. 22803}
  so=$(cd "$here/.." && cargo build -q -p nccl-double --message-format=json 2>/dev/null |
    jq -r 'select(.reason=="compiler-artifact" and .target.name=="nccl_double") | .filenames[] | select(endswith(".so"))')
  ln -s "$so" "$tmp/libcuda.so.1"
  ln -s "$so" "$tmp/libnccl.so.2"
  export LD_LIBRARY_PATH="$tmp" NCCL_DOUBLE=1 NCCL_DOUBLE_VERSION="$version" NCCL_DOUBLE_DIR="$tmp"
fi
run() { # VAR VALUE
  printf '%s=%-32s ' "$1" "${2:-(unset)}"
  if [[ -n $2 ]]; then env "$1=$2" timeout 60 "$tmp/nccl-env" 2>&1 | tail -1
  else timeout 60 "$tmp/nccl-env" 2>&1 | tail -1; fi
}
run NCCL_ALGO ""
for v in Ring Tree ring,tree '^ring' Bogus 'allreduce:tree;broadcast:ring' 'allreduce:tree' \
  'tree;ring' 'allreduce:bogus' 'sendrecv:ring' 'bogus:ring' NVLS PAT CollNetDirect; do
  run NCCL_ALGO "$v"
done
for v in LL LL128 Simple '^LL128' Bogus 'allreduce:ll' 'allreduce:^simple' 'll;simple'; do
  run NCCL_PROTO "$v"
done
