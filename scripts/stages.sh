#!/usr/bin/env bash
# Runs `make STAGE` for each stage named, in order, timing each, and prints a table of the stages (wall
# seconds, CPU seconds of the stage's processes, outcome) at the end; exits non-zero when any stage
# failed. A failed stage does not stop the later ones (each reports its own failures), except that a
# stage is not run twice: make's own dependencies (the venv, the builds) run in the first stage that
# needs them and are timed there.
#   scripts/stages.sh test-cpp test-python ...
set -uo pipefail
cd "$(dirname "$0")/.."
(( $# )) || { echo "stages.sh: name at least one make target"; exit 2; }
rows=()
status=0
t0=$(date +%s)
for stage in "$@"; do
  start=$(date +%s.%N)
  cpu0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
  if make --no-print-directory "$stage"; then outcome=ok; else outcome=FAILED; status=1; fi
  end=$(date +%s.%N)
  # children's CPU time (utime + stime of waited-for children, in clock ticks) accrued by this stage
  cpu1=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
  ticks=$(getconf CLK_TCK)
  rows+=("$(awk -v s="$stage" -v w="$end - $start" -v a="$start" -v b="$end" -v c0="$cpu0" -v c1="$cpu1" -v t="$ticks" \
            -v o="$outcome" 'BEGIN { printf "%-20s %8.0f %8.0f  %s", s, b - a, (c1 - c0) / t, o }')")
done
echo
echo "== stages ($(nproc) cores) =="
printf '%-20s %8s %8s  %s\n' stage "wall s" "cpu s" outcome
for r in "${rows[@]}"; do echo "$r"; done
printf '%-20s %8d\n' total "$(( $(date +%s) - t0 ))"
exit $status
