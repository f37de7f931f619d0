#!/usr/bin/env bash
# Runs every libFuzzer target the build declares (<build>/fuzz_targets.txt, written by `make
# build-san`: the case-file loader's and one per op that declares FUZZ in src/ops/<op>/CMakeLists.txt)
# for SECONDS each on its corpus in fuzz/corpus/<target> (copied to a temporary directory, so a run
# never edits the repo), the case-file target also seeded with every case file opgym ships and
# PyPTO-Gym's. Prints the inputs each target tried; exits non-zero on the first crash, leak,
# sanitizer report or timeout, leaving the reproducer in fuzz/findings/ (turn it into a regression
# test, add it to the corpus).
#   scripts/fuzz.sh [SECONDS [run|merge [BUILD]]]   default 10 run build-san
#   scripts/fuzz.sh SECONDS merge        fold what a longer run found into fuzz/corpus (minimized)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-10}"
MODE="${2:-run}"
BUILD="${3:-build-san}"
[[ -f $BUILD/fuzz_targets.txt ]] || { echo "fuzz: $BUILD/fuzz_targets.txt is missing (make build-san)"; exit 2; }
mapfile -t targets < <(grep -v '^$' "$BUILD/fuzz_targets.txt")
(( ${#targets[@]} )) || { echo "fuzz: $BUILD declares no fuzz target"; exit 2; }
mkdir -p fuzz/findings
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
for t in "${targets[@]}"; do
  exe="$BUILD/fuzz_$t"
  [[ -x "$exe" ]] || { echo "fuzz: $exe is missing (make build-san)"; exit 2; }
  mkdir -p "$tmp/$t" "fuzz/corpus/$t"
  cp -r "fuzz/corpus/$t/." "$tmp/$t/" 2>/dev/null || true
  seeds=()
  if [[ "$t" == case_file ]]; then
    mkdir -p "$tmp/seeds"
    for f in cases/*/*.json ../shared/peer-cases/*.json; do [[ -f "$f" ]] && cp "$f" "$tmp/seeds/"; done
    seeds=("$tmp/seeds")
  fi
  log="$tmp/$t.log"
  set +e
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$exe" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=4096 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="fuzz/findings/${t}-" "$tmp/$t" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  runs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo '?')"
  corpus="$(ls "$tmp/$t" | wc -l)"
  if (( rc != 0 )); then
    echo "fuzz $t: FAILED after $runs inputs (rc $rc); reproducer in fuzz/findings/"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -8
    status=1
  else
    echo "fuzz $t: $runs inputs in ${SECONDS_EACH}s, no crash (corpus $corpus)"
  fi
  if [[ "$MODE" == merge && $rc == 0 ]]; then
    mkdir -p "$tmp/$t.min"
    "$exe" -merge=1 "$tmp/$t.min" "fuzz/corpus/$t" "$tmp/$t" >/dev/null 2>&1
    rm -rf "fuzz/corpus/$t" && mv "$tmp/$t.min" "fuzz/corpus/$t"
    echo "  merged: fuzz/corpus/$t has $(ls "fuzz/corpus/$t" | wc -l) inputs"
  fi
done
exit $status
