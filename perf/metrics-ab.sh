#!/bin/bash
# What the live metrics cost: the keyed and window workloads with the control endpoint on and
# a client scraping its Prometheus metrics every 100 ms (B) against the endpoint off (A), in
# alternating pairs (the order swapped each round, so a drift of the machine's load falls on
# both). Prints each pair's throughput ratio B ÷ A and per workload the median and spread;
# the goal is within 1%. On a small shared machine the pairs move more than that with the load,
# so it then counts what a scrape costs directly: the CPU time of the endpoint's thread
# (/proc) over 2000 scrapes of the window workload's metrics. Needs curl, python3 and a
# release build.
#   perf/metrics-ab.sh [ROUNDS] [SECONDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-5} secs=${2:-10}
bin=target/release/weir
[ -x "$bin" ] || { echo "build it first: cargo build --release" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"; kill $(jobs -p) 2>/dev/null || true' EXIT
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ)"
off() { "$bin" bench --workload "$1" --duration-s "$secs" --no-progress --json "$out/$2.json" >/dev/null; }
on() {
  "$bin" bench --workload "$1" --duration-s "$secs" --no-progress --json "$out/$2.json" --control 127.0.0.1:0 \
    >"$out/$2.log" 2>&1 &
  local pid=$!
  local addr=""
  until [ -n "$addr" ]; do
    addr=$(sed -n 's|.*control endpoint: http://\([^ /]*\).*|\1|p' "$out/$2.log")
    sleep 0.01
  done
  local scrapes=0
  while kill -0 "$pid" 2>/dev/null; do
    curl -s "http://$addr/metrics" >/dev/null && scrapes=$((scrapes + 1)) || true
    sleep 0.1
  done
  wait "$pid"
  echo "$scrapes" >"$out/$2.scrapes"
}
for r in $(seq "$rounds"); do
  for w in keyed window; do
    if [ $((r % 2)) = 1 ]; then off "$w" "$w-off-$r"; on "$w" "$w-on-$r"; else on "$w" "$w-on-$r"; off "$w" "$w-off-$r"; fi
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for w in ["keyed", "window"]:
    ratios = []
    for r in range(1, rounds + 1):
        a = json.load(open(f"{out}/{w}-off-{r}.json"))["throughput_rps"]
        b = json.load(open(f"{out}/{w}-on-{r}.json"))["throughput_rps"]
        scrapes = open(f"{out}/{w}-on-{r}.scrapes").read().strip()
        ratios.append(b / a)
        print(f"{w:>7} round {r}: off {a:,.0f} rec/s, on {b:,.0f} rec/s ({scrapes} scrapes), on ÷ off {b / a:.4f}")
    print(f"{w:>7}: median on ÷ off {statistics.median(ratios):.4f} (lowest {min(ratios):.4f}, highest {max(ratios):.4f})")
PY
# The endpoint's own CPU per scrape: its thread's user + system time over 2000 scrapes.
"$bin" bench --workload window --duration-s 60 --no-progress --control 127.0.0.1:0 >"$out/cpu.log" 2>&1 &
pid=$!
addr=""
until [ -n "$addr" ]; do addr=$(sed -n 's|.*control endpoint: http://\([^ /]*\).*|\1|p' "$out/cpu.log"); sleep 0.01; done
thread=$(grep -l '^weir-control$' /proc/$pid/task/*/comm | head -1 | xargs dirname)
ticks() { awk '{print $14 + $15}' "$thread/stat"; }
before=$(ticks)
curl -s "http://$addr/metrics?[1-2000]" -o /dev/null
after=$(ticks)
kill "$pid"; wait "$pid" 2>/dev/null || true
hz=$(getconf CLK_TCK)
python3 -c "
cpu = ($after - $before) / $hz
print(f'endpoint CPU: {cpu:.2f} s over 2000 scrapes, {cpu / 2000 * 1e6:.0f} µs a scrape: at one per 100 ms, {cpu / 2000 * 10 * 100:.3f}% of one core')"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
