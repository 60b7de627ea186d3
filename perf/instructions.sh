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
# scraped every second of wall time, as Prometheus would, against the same without it; and
# what one scrape costs the process (the endpoint, its HTTP, the collector reading the job),
# from W2 scraped every 10 ms against W2 alone. (Under callgrind a run is ~50x slower and sees
# ~50x the scrapes per record a real run does, so the scrapes are counted apart, not spread
# over the records.)
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
# workload n [scrape ms] -> instructions inside the workers' run loop
count_workers() {
  WEIR_BUDGET_SCRAPE_MS=${3:-} valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    --toggle-collect='*Worker*run*' "$bin" "$1" "$2" "$scratch" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
if [ "${1:-}" = --scraped ]; then
  printf '%-10s %10s %16s %16s %8s\n' workload N "workers/record" "scraped 1/s" ratio
  for spec in W1:1000000 W2:500000 W3:200000 W5:500000 wordcount:300000; do
    w=${spec%%:*} n=${spec#*:}
    "$bin" "$w" $((2 * n)) "$scratch" >/dev/null && "$bin" "$w" "$n" "$scratch" >/dev/null
    a=$(count_workers "$w" "$n") b=$(count_workers "$w" $((2 * n)))
    sa=$(count_workers "$w" "$n" 1000) sb=$(count_workers "$w" $((2 * n)) 1000)
    awk -v w="$w" -v n="$n" -v a="$a" -v b="$b" -v sa="$sa" -v sb="$sb" 'BEGIN {
      plain = (b - a) / n; scraped = (sb - sa) / n
      printf "%-10s %10s %16.1f %16.1f %8.3f\n", w, n, plain, scraped, scraped / plain
    }'
  done
  # One scrape's cost to the process: W2 scraped every 10 ms against W2 alone, whole process.
  n=2000000
  plain=$(count W2 "$n")
  out=$(WEIR_BUDGET_SCRAPE_MS=10 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" W2 "$n" "$scratch" 2>&1)
  scraped=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' <<<"$out")
  scrapes=$(sed -n 's/^scrapes \([0-9]*\)/\1/p' <<<"$out")
  awk -v p="$plain" -v s="$scraped" -v k="$scrapes" 'BEGIN {
    printf "one scrape (W2, %d scrapes every 10 ms): %.0f instructions, the endpoint'"'"'s start included\n", k, (s - p) / k
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
