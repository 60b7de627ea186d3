#!/bin/bash
# The checkpoint lab against separate runs: on a job with a fixed backlog (the backpressure
# workload, its rings full, 100 µs a record at the sink), the lab's paired ratio of
# consecutive checkpoints (unaligned ÷ aligned, inside one run) against the ratio of the
# medians of two separate runs, one per mode. On a quiet machine the two agree; on a busy one
# the separate runs' ratio moves with the load and the lab's does not. Checkpoints triggered in
# the first 2 s (while the rings fill) are left out. Needs python3 and a release build.
#   perf/lab-vs-separate.sh [ROUNDS] [SECONDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3} secs=${2:-10}
bin=target/release/weir
[ -x "$bin" ] || { echo "build it first: cargo build --release" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ)"
run() { # name checkpoint
  "$bin" bench --workload backpressure --sink-cost-ns 100000 --checkpoint "$2" --duration-s "$secs" \
    --no-progress --json "$out/$1.json" >/dev/null
}
for r in $(seq "$rounds"); do
  # Alternating, so each round's three runs share the moment's load as far as they can.
  run "lab-$r" alternate:aligned,unaligned
  run "aligned-$r" aligned
  run "unaligned-$r" unaligned
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def steady(name):
    return [c for c in json.load(open(f"{out}/{name}.json"))["checkpoints"] if c["trigger_ms"] >= 2000]
print(f"{'round':>5} {'lab paired ratio':>17} {'separate ratio':>15} {'lab ÷ separate':>15} {'aligned (separate)':>19} {'unaligned (separate)':>21}")
for r in range(1, rounds + 1):
    lab = steady(f"lab-{r}")
    pairs = [b["duration_ms"] / a["duration_ms"] if a["alignment"] == "aligned" else a["duration_ms"] / b["duration_ms"]
             for a, b in zip(lab, lab[1:]) if a["alignment"] != b["alignment"]]
    al = statistics.median(c["duration_ms"] for c in steady(f"aligned-{r}"))
    un = statistics.median(c["duration_ms"] for c in steady(f"unaligned-{r}"))
    paired = statistics.median(pairs)
    print(f"{r:>5} {paired:>17.4f} {un / al:>15.4f} {paired / (un / al):>15.2f} {al:>16.1f} ms {un:>18.2f} ms")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
