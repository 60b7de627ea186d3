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
# `--scraped`: the same figures with the control endpoint on and its metrics scraped every
# second of wall time (as Prometheus would), each thread counted apart (callgrind
# --separate-threads): the job's threads against the plain run's, and what the endpoint and
# its scraper cost per scrape. (Under callgrind a run is ~50x slower, so it sees ~50x the
# scrapes per record a real run does: those are counted apart, not spread over the records.)
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
# workload n -> "job endpoint scrapes": instructions of the job's threads, of the endpoint's
# and the scraper's, and the scrapes made, with the endpoint on and scraped every second.
count_scraped() {
  local d f t job=0 served=0 scrapes
  d=$(mktemp -d)
  scrapes=$(WEIR_BUDGET_SCRAPE_MS=1000 valgrind --tool=callgrind --separate-threads=yes \
    --callgrind-out-file="$d/cg" "$bin" "$1" "$2" "$scratch" 2>&1 >/dev/null | sed -n 's/^scrapes \([0-9]*\)/\1/p')
  for f in "$d"/cg-*; do
    t=$(sed -n 's/^\(totals\|summary\): *\([0-9]*\).*/\2/p' "$f" | head -1)
    if grep -q 'tokio\|scrape_metrics_every' "$f"; then served=$((served + t)); else job=$((job + t)); fi
  done
  rm -rf "$d"
  echo "$job $served ${scrapes:-0}"
}
if [ "${1:-}" = --scraped ]; then
  printf '%-10s %10s %14s %14s %8s %16s\n' workload N "instr/record" "scraped" ratio "instr/scrape"
  for spec in W1:1000000 W2:500000 W3:200000 wordcount:300000; do
    w=${spec%%:*} n=${spec#*:}
    "$bin" "$w" $((2 * n)) "$scratch" >/dev/null && "$bin" "$w" "$n" "$scratch" >/dev/null
    a=$(count "$w" "$n") b=$(count "$w" $((2 * n)))
    read -r ja sa ka <<<"$(count_scraped "$w" "$n")"
    read -r jb sb kb <<<"$(count_scraped "$w" $((2 * n)))"
    awk -v w="$w" -v n="$n" -v a="$a" -v b="$b" -v ja="$ja" -v jb="$jb" -v s="$((sa + sb))" -v k="$((ka + kb))" 'BEGIN {
      plain = (b - a) / n; scraped = (jb - ja) / n
      printf "%-10s %10s %14.1f %14.1f %8.3f %16s\n", w, n, plain, scraped, scraped / plain, (k > 0 ? sprintf("%.0f (%d)", s / k, k) : "-")
    }'
  done
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
