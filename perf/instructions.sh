#!/bin/bash
# Instruction budgets: instructions per record of W1, W2, W3 (Flink's peer workloads), word
# count (per word) and Nexmark q5 (per event) at parallelism 1 on one worker, without
# checkpoints, counted by callgrind on a fixed input. Each workload runs twice, at N and 2N
# records, and the difference over N is the figure: start-up and tear-down cancel out.
# Counts are the same on a busy machine as on a quiet one, where times are not.
#
# Prints each figure next to the baseline in perf/instructions-baseline.txt and flags one
# more than 10% above it; exits 1 if any is. `--save` writes the figures as the new baseline
# (after a change that is meant to cost or save instructions: say so in the commit).
#
# `--scraped`: what the metrics cost. The budgets counted on the workers alone (callgrind
# collecting only inside the worker's run loop) with the control endpoint on and its metrics
# scraped every 10 ms — a hundred times Prometheus' usual rate, so that a run under callgrind
# sees scrapes at all (W2's 2 M records take 0.02 s natively) — against the same without it;
# and what one scrape costs the process (the endpoint, its HTTP, the collector reading the
# job), from W2 scraped every 10 ms against W2 alone, whole process.
#   perf/instructions.sh [--save | --scraped]
set -eu
cd "$(dirname "$0")/.."
baseline=perf/instructions-baseline.txt
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
bin=$(cargo build --release --bench budget --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*budget[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "could not build the budget runner (cargo build --release --bench budget)" >&2; exit 2; }
scratch=target/budget
count() { # workload n -> instructions
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" "$scratch" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
# workload n [scrape ms] [toggle] -> "instructions scrapes": callgrind's count (inside the
# workers' run loop with a toggle, else the whole process) and the scrapes the run made.
count_with() {
  local err scrapes
  err=$(mktemp)
  scrapes=$(WEIR_BUDGET_SCRAPE_MS=${3:-} valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    ${4:+--toggle-collect=$4} "$bin" "$1" "$2" "$scratch" 2>"$err" | sed -n 's/^scrapes \([0-9]*\)/\1/p')
  echo "$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$err") ${scrapes:-0}"
  rm -f "$err"
}
if [ "${1:-}" = --scraped ]; then
  workers='*Worker*run*'
  printf '%-10s %10s %16s %16s %8s %8s\n' workload N "workers/record" "scraped" ratio scrapes
  for spec in W1:1000000 W2:2000000 W3:200000 W5:500000 wordcount:300000; do
    w=${spec%%:*} n=${spec#*:}
    "$bin" "$w" $((2 * n)) "$scratch" >/dev/null && "$bin" "$w" "$n" "$scratch" >/dev/null
    read -r a _ <<<"$(count_with "$w" "$n" "" "$workers")"
    read -r b _ <<<"$(count_with "$w" $((2 * n)) "" "$workers")"
    read -r sa ka <<<"$(count_with "$w" "$n" 10 "$workers")"
    read -r sb kb <<<"$(count_with "$w" $((2 * n)) 10 "$workers")"
    awk -v w="$w" -v n="$n" -v a="$a" -v b="$b" -v sa="$sa" -v sb="$sb" -v k="$((ka + kb))" 'BEGIN {
      plain = (b - a) / n; scraped = (sb - sa) / n
      printf "%-10s %10s %16.1f %16.1f %8.3f %8d\n", w, n, plain, scraped, scraped / plain, k
    }'
  done
  n=2000000
  read -r plain _ <<<"$(count_with W2 "$n")"
  read -r scraped scrapes <<<"$(count_with W2 "$n" 10)"
  awk -v p="$plain" -v s="$scraped" -v k="$scrapes" 'BEGIN {
    printf "one scrape (W2, %d scrapes every 10 ms, whole process): %.0f instructions, the endpoint'"'"'s start included\n", k, (s - p) / k
  }'
  exit 0
fi
over=0 out=""
printf '%-10s %10s %14s %14s %8s\n' workload N "instr/record" baseline ratio
for spec in W1:1000000 W2:500000 W2p2:500000 W3:200000 W5:500000 wordcount:300000 wordcount-strings:300000 q5:200000; do
  w=${spec%%:*} n=${spec#*:}
  # Once outside the count: word count's corpora are written then (and kept).
  "$bin" "$w" $((2 * n)) "$scratch" >/dev/null && "$bin" "$w" "$n" "$scratch" >/dev/null
  a=$(count "$w" "$n") b=$(count "$w" $((2 * n)))
  per=$(awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "%.1f", (b - a) / n }')
  base=$(awk -v w="$w" '$1 == w { print $2 }' "$baseline" 2>/dev/null || true)
  if [ -n "$base" ]; then
    ratio=$(awk -v p="$per" -v b="$base" 'BEGIN { printf "%.3f", p / b }')
    flag=$(awk -v r="$ratio" 'BEGIN { if (r > 1.10) print "  over budget (+10%)" }')
    [ -n "$flag" ] && over=1
  else
    base=- ratio=- flag=""
  fi
  printf '%-10s %10s %14s %14s %8s%s\n' "$w" "$n" "$per" "$base" "$ratio" "$flag"
  out+="$w $per"$'\n'
done
if [ "${1:-}" = --save ]; then
  { echo "# instructions per record (perf/instructions.sh --save), $(git rev-parse --short HEAD), $(date +%Y-%m-%d)"; printf '%s' "$out"; } >"$baseline"
  echo "saved $baseline"
fi
exit $over
