#!/bin/bash
# Keyed state as it grows: the keyed workload (W2: generator → key_by → running sum) at
# doubling key counts, each run in a process of its own, and per run its throughput, the most
# its state's pages held, that per key, the process's peak resident memory, and with
# checkpoints their median and longest duration. What issue 59's memory budget is measured
# against (bytes a key, how throughput falls once the state leaves the caches).
#
#   perf/state-growth.sh [FIRST_KEYS] [LAST_KEYS] [-- weir bench flags…]
#
# Say `--zipf 1.0` for skewed access, `--checkpoint aligned --interval-ms 1000` for
# checkpoints, `--state-memory 512MiB` for a fixed budget (then each row also says the most
# in memory, the pages that left it and came back, and a fault's mean wait); the default
# runs 5 s each from 1 M to 16 M keys, 2 workers, no checkpoints, no budget.
# Needs `cargo build --release` first.
set -eu
first=${1:-1000000}
last=${2:-16000000}
shift $(( $# >= 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
weir=$(cd "$(dirname "$0")/.." && pwd)/target/release/weir
[ -x "$weir" ] || { echo "no $weir: run cargo build --release first" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); flags: --workers 2 --duration-s 5 $*"
echo
echo "| keys | records/s | state pages, most | bytes a key | peak RSS | checkpoints | median ms | longest ms | in memory, most | evictions | faults | fault µs |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
keys=$first
while [ "$keys" -le "$last" ]; do
  "$weir" bench --workload keyed --keys "$keys" --workers 2 --duration-s 5 --no-progress \
    --json "$out/$keys.json" "$@" > "$out/$keys.log" 2>&1 || { cat "$out/$keys.log" >&2; exit 1; }
  python3 - "$out/$keys.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
d = sorted(c["duration_ms"] for c in r["checkpoints"])
med = f'{d[len(d) // 2]:.0f}' if d else '–'
top = f'{d[-1]:.0f}' if d else '–'
rss = r.get("peak_rss_bytes") or 0
b = r.get("state_memory")
cold = (f'{b["resident_peak_bytes"] / 1e6:,.0f} MB | {b["evictions"]:,} | {b["faults"]:,} | '
        f'{b["fault_nanos"] / max(b["faults"], 1) / 1e3:.1f} |') if b else '– | – | – | – |'
print(f'| {r["keys"]:,} | {r["throughput_rps"]:,.0f} | {r["state_peak_bytes"] / 1e6:,.0f} MB | '
      f'{r["state_peak_bytes"] / r["keys"]:.0f} | {rss / 1e6:,.0f} MB | {len(d)} | {med} | {top} | {cold}')
EOF
  keys=$(( keys * 2 ))
done
