#!/bin/bash
# The peers' weir jobs (../shared/peers/weir) side by side: built against a base revision and
# against this checkout, run alternately for ROUNDS rounds at P=2, with timely's W2 (its
# `fast` hasher) beside weir's W2 when timely's peer is built. Prints one RESULT line per run,
# prefixed with the build, and the load at each round's start.
#
# The peers' file is built as it is but for two things it predates: the package is
# `weir-stream` (its library still `weir`), and the checkpoint mode is typed
# (`CheckpointMode::Aligned` / `Unaligned` for its `ExactlyOnce` + `.unaligned(bool)`).
#
#   perf/peers-ab.sh BASE_REV [ROUNDS] [SPECS_FILE]
# SPECS_FILE: lines of `WORKLOAD N MODE [W5_RATE]` (default below).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: perf/peers-ab.sh BASE_REV [ROUNDS] [SPECS_FILE]}
rounds=${2:-3}
work=${PEERS_AB_WORK:-target/peers-ab}
peers=$(cd ../shared/peers && pwd)
mkdir -p "$work/bin"
specs=${3:-$work/specs}
[ $# -ge 3 ] || cat > "$specs" <<SPECS
W1 2000000000 none
W2 300000000 none
W2 300000000 aligned
W3 150000000 none
W3 150000000 aligned
W5 5000000 aligned 1000000
W5 50000 aligned 10000
SPECS
build() { # name source-dir
  local b=$work/peer-$1
  mkdir -p "$b/src"
  sed -e 's/\.mode(CheckpointMode::ExactlyOnce)/.mode(if mode == "unaligned" { CheckpointMode::Unaligned } else { CheckpointMode::Aligned })/' \
      -e 's/\.unaligned(mode == "unaligned"),/,/' "$peers/weir/src/main.rs" > "$b/src/main.rs"
  printf '#[global_allocator]\nstatic A: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;\n' >> "$b/src/main.rs"
  cat > "$b/Cargo.toml" <<TOML
[package]
name = "weir-peer"
version = "0.0.0"
edition = "2021"
[dependencies]
weir = { package = "weir-stream", path = "$2" }
tikv-jemallocator = "0.7"
[profile.release]
lto = "thin"
codegen-units = 1
debug = "line-tables-only"
[workspace]
TOML
  (cd "$b" && CARGO_TARGET_DIR="$(pwd)/../target" cargo build --release -q)
  cp "$work/target/release/weir-peer" "$work/bin/weir-peer-$1"
}
rm -rf "$work/base-src" && git worktree add -f --detach "$work/base-src" "$base" -q
trap 'git worktree remove --force "$work/base-src"' EXIT
build base "$(cd "$work/base-src" && pwd)"
build head "$(pwd)"
timely=/tmp/weir-peer-timely/release/timely-peer
for r in $(seq 1 "$rounds"); do
  echo "# round $r load $(cut -d' ' -f1-3 /proc/loadavg)"
  while read -r w n mode rate; do
    for v in base head; do
      echo -n "$v: "
      W5_RATE=${rate:-1000000} "$work/bin/weir-peer-$v" "$w" "$n" "$mode" 2 "$work/ckpt-$v-$w-$mode" | grep '^RESULT'
    done
    if [ "$w" = W2 ] && [ "$mode" = none ] && [ -x "$timely" ]; then
      echo -n "timely: "; "$timely" W2 "$n" 2 fast | tail -1
    fi
  done < "$specs"
done
