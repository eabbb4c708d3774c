# shellcheck shell=bash
# Where cargo put the workbook's release binaries. Sourced by slurm/run.sh (on the compute
# node), .ci/slurm/check.sh and bench/gpu-check.sh; run it to print the folder:
#   bash slurm/find-bins.sh [NAME...]          # from the workbook's folder; no NAME: every lesson
#
# workbook_lessons prints the lessons, one a line, in order: the folders NN-name (two
# digits, a dash) of the workbook whose Cargo.toml has a [[bin]] named as the folder (the
# binary keeps the folder's name). A lesson is its folder and its batch script,
# slurm/NN-name.sbatch: nothing else lists the lessons (workbook/tests/lessons.rs checks
# that every lesson has its script, and every script its lesson). A folder NN-name that is
# not such a crate is left out, with a warning on stderr.
workbook_lessons() {
  local root dir name
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1
  for dir in "$root"/[0-9][0-9]-*/; do
    [ -d "$dir" ] || continue
    name=$(basename "$dir")
    # The name = "..." line of a [[bin]] section (the package's own name cannot start with
    # a digit, so a lesson's binary is always declared).
    if awk -v want="name = \"$name\"" '
        /^[[:space:]]*\[/ { in_bin = ($0 ~ /^[[:space:]]*\[\[bin\]\]/) }
        in_bin { line = $0; gsub(/[[:space:]]+/, " ", line); sub(/^ /, "", line); sub(/ $/, "", line)
                 if (line == want) found = 1 }
        END { exit !found }' "$dir/Cargo.toml" 2>/dev/null; then
      echo "$name"
    else
      echo "warning: $name/ is not a lesson: no Cargo.toml with a [[bin]] named \"$name\" in it" >&2
    fi
  done
}

# find_workbook_bins NAME... sets WORKBOOK_BIN_DIR to the folder cargo builds into, and
# WORKBOOK_BIN_FROM to how that was found; the first of these that says wins:
#   1. $NCCL_WORKBOOK_BIN_DIR: binaries you point at (built elsewhere, copied, prebuilt);
#   2. `cargo metadata`'s target folder, /release, where cargo is on PATH: it knows
#      CARGO_TARGET_DIR and build.target-dir of .cargo/config.toml (a compute node may
#      have no cargo: then the next);
#   3. $CARGO_TARGET_DIR/release (sbatch passes the submitting shell's variables on);
#   4. ./target/release, cargo's default, in the current folder (the workbook's).
# If a NAME is missing there, it returns 1 and says on stderr where it looked, and where
# else a build lies (an older one, say) without ever taking it silently.
find_workbook_bins() {
  local names=("$@") candidates=() meta dir how
  if [ -n "${NCCL_WORKBOOK_BIN_DIR:-}" ]; then
    dir=$NCCL_WORKBOOK_BIN_DIR
    [[ $dir == /* ]] || dir=$PWD/$dir
    candidates+=("$dir|NCCL_WORKBOOK_BIN_DIR")
  fi
  local cargo_note="" cargo_dir=""
  if command -v cargo >/dev/null 2>&1; then
    # --offline --no-deps: reads the workspace's manifests and config, fetches nothing.
    meta=$(timeout 60 cargo metadata --format-version 1 --no-deps --offline 2>/dev/null || true)
    dir=$(printf '%s' "$meta" | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    if [ -n "$dir" ]; then
      cargo_dir=$dir
      candidates+=("$dir/release|from cargo metadata")
    else
      cargo_note="cargo is on PATH, but \`cargo metadata\` did not answer here (not the workbook's folder?)"
    fi
  else
    cargo_note="no cargo on PATH here, so not asked"
  fi
  if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    dir=$CARGO_TARGET_DIR
    [[ $dir == /* ]] || dir=$PWD/$dir
    candidates+=("$dir/release|CARGO_TARGET_DIR")
  fi
  candidates+=("$PWD/target/release|cargo's default")

  # What a folder lacks of NAME..., as " name name" (empty: it has them all).
  lacks() {
    local name out=""
    for name in "${names[@]}"; do
      if [ ! -f "$1/$name" ] || { [[ $name != *.so ]] && [ ! -x "$1/$name" ]; }; then
        out+=" $name"
      fi
    done
    printf '%s' "$out"
  }
  dir=${candidates[0]%%|*} how=${candidates[0]#*|}
  local missing
  missing=$(lacks "$dir")
  if [ -z "$missing" ]; then
    # shellcheck disable=SC2034 # for the caller that sourced this file
    WORKBOOK_BIN_DIR=$dir WORKBOOK_BIN_FROM=$how
    return 0
  fi
  {
    if [ -d "$dir" ]; then
      echo "error:$missing not built in $dir ($how)."
    else
      echo "error: the binaries' folder $dir ($how) does not exist: nothing built there."
    fi
    echo "Where the binaries are looked for, the first that says wins:"
    echo "  1. NCCL_WORKBOOK_BIN_DIR: ${NCCL_WORKBOOK_BIN_DIR:-not set}"
    echo "  2. cargo metadata: ${cargo_dir:+$cargo_dir/release}${cargo_note}"
    if [ -n "${CARGO_TARGET_DIR:-}" ]; then
      echo "  3. CARGO_TARGET_DIR: $CARGO_TARGET_DIR/release"
    else
      echo "  3. CARGO_TARGET_DIR: not set"
    fi
    echo "  4. cargo's default: $PWD/target/release"
    local c
    for c in "${candidates[@]:1}"; do
      if [ "${c%%|*}" != "$dir" ] && [ -z "$(lacks "${c%%|*}")" ]; then
        if [ -n "${NCCL_WORKBOOK_BIN_DIR:-}" ]; then
          echo "A build is in ${c%%|*} (${c#*|}): unset NCCL_WORKBOOK_BIN_DIR to use it."
        else
          echo "A build is in ${c%%|*} (${c#*|}), maybe an older one; to use it anyway:"
          echo "  export NCCL_WORKBOOK_BIN_DIR=${c%%|*}"
        fi
        break
      fi
    done
    local set_dir
    set_dir=$(sed -n 's/^[[:space:]]*target-dir[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' .cargo/config.toml 2>/dev/null | head -n 1)
    if [ -z "$cargo_dir" ] && [ -n "$set_dir" ]; then
      echo ".cargo/config.toml sets build.target-dir = \"$set_dir\" (only cargo reads it); to use it:"
      echo "  export NCCL_WORKBOOK_BIN_DIR=$set_dir/release   (before sbatch, or in slurm/site.sh)"
    fi
    echo "Build on the login node, from the workbook's folder: cargo build --release"
    echo "(compute nodes build nothing). If cargo's target is elsewhere (build.target-dir) and the"
    echo "compute nodes have no cargo, export CARGO_TARGET_DIR or NCCL_WORKBOOK_BIN_DIR before sbatch."
  } >&2
  return 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  if [ $# = 0 ]; then mapfile -t lessons < <(workbook_lessons) && set -- ${lessons[@]+"${lessons[@]}"}; fi
  find_workbook_bins "$@"
  echo "$WORKBOOK_BIN_DIR"
fi
