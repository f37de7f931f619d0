#!/usr/bin/env bash
# Runs make targets as timed stages and prints a table of them at the end (wall seconds, outcome, and when
# each started and ended); exits non-zero when any stage failed.
#
#   scripts/stages.sh deps venv "test-cpp+test-python|build-san+test-san" ...
#
# Each argument is a group run after the previous one: chains separated by "|" run side by side (each in
# the background, its output kept in a file and printed whole when the group ends, so logs do not
# interleave); the stages of a chain ("a+b") run in order, and a chain stops at its first failed stage.
# A failed group does not stop the later ones: each reports its own failures.
set -uo pipefail
cd "$(dirname "$0")/.."
(( $# )) || { echo "stages.sh: name at least one make target"; exit 2; }
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
t0=$(date +%s)
rows="$logs/rows"
: > "$rows"

now() { echo $(( $(date +%s) - t0 )); }

run_chain() {  # run_chain ID STAGE...: the stages in order, each row appended to $rows
  local id=$1; shift
  local stage start rc=0
  for stage in "$@"; do
    start=$(now)
    if make --no-print-directory "$stage"; then
      printf '%-22s %7d %7d %7d  ok\n' "$stage" $(( $(now) - start )) "$start" "$(now)" >> "$rows"
    else
      printf '%-22s %7d %7d %7d  FAILED\n' "$stage" $(( $(now) - start )) "$start" "$(now)" >> "$rows"
      rc=1
      break
    fi
  done
  return $rc
}

status=0
for group in "$@"; do
  IFS='|' read -r -a chains <<< "$group"
  if (( ${#chains[@]} == 1 )); then
    IFS='+' read -r -a stages <<< "${chains[0]}"
    run_chain 0 "${stages[@]}" || status=1
    continue
  fi
  pids=()
  for i in "${!chains[@]}"; do
    IFS='+' read -r -a stages <<< "${chains[$i]}"
    echo "== $(date -u +%H:%M:%S) started beside the others: ${stages[*]} (log printed when the group ends)"
    run_chain "$i" "${stages[@]}" > "$logs/chain$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "== log of: ${chains[$i]//+/ }"
    cat "$logs/chain$i.log"
  done
done

echo
echo "== stages ($(nproc) cores; stages of one group ran side by side) =="
printf '%-22s %7s %7s %7s  %s\n' stage "wall s" "from s" "to s" outcome
cat "$rows"
printf '%-22s %7d\n' total "$(now)"
exit $status
