#!/usr/bin/env bash
# Stops what start-slurm.sh started, by pid (never by name): slurmd, slurmctld, and
# munged if start-slurm.sh started it.
set -uo pipefail
[ "$(id -u)" = 0 ] || exec sudo -E bash "$0" "$@"
run=/run/slurm-local
command -v scancel >/dev/null && scancel --user=root >/dev/null 2>&1
stop() { # stop PIDFILE PROGRAM
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]; then
    echo "[stop-slurm] stopping $2 (pid $pid)"
    kill "$pid" 2>/dev/null
    for _ in $(seq 100); do
      state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || break
      [ "$state" = Z ] && break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$1"
}
for f in "$run"/slurmd-*.pid; do [ -e "$f" ] && stop "$f" slurmd; done
stop "$run/slurmctld.pid" slurmctld
if [ -e "$run/munged.started-by-slurm-local" ]; then
  stop /run/munge/munged.pid munged
  rm -f "$run/munged.started-by-slurm-local"
fi
exit 0
