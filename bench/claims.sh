#!/usr/bin/env bash
# Reruns every figure and comparison that README.md, docs/ and EXERCISES.md state, on
# this machine, and prints the text's figures beside the measured ones with the direction
# of each comparison checked (bench/claims/claims.json lists them). Run it after any
# change to the CPU backend, and rewrite the text from what it prints.
#   bench/claims.sh                 every claim, medians of 5 rounds (about 15 minutes)
#   bench/claims.sh ch7 ch4         the claims whose id starts so
#   bench/claims.sh --quick         each command once, no timing judged (CI)
#   bench/claims.sh --list          the claims
#   bench/claims.sh --write docs/measured.md   every claim, and the figures written as a page
# Works wherever cargo's target is (CARGO_TARGET_DIR, build.target-dir).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release --workspace
target=$(cargo metadata --format-version 1 --no-deps --offline | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
exec "$target/release/claims" "$@"
