#!/bin/bash
# Every simulated job, mode and parallelism 1-4, full and incremental checkpoints, over a
# range of seeds (default 1000..3000): prints only the seeds that differ from the golden run
# and the summary of each combination that had any. Needs `cargo build --release` first.
#   perf/simulate-sweep.sh 1000..3000
set -u
seeds=${1:-1000..3000}
weir=$(dirname "$0")/../target/release/weir
for inc in "" "--incremental"; do
  for mode in aligned unaligned aligned-timeout at-least-once; do
    for job in wordcount window join keyed; do
      for p in 1 2 3 4; do
        "$weir" simulate --job "$job" --mode "$mode" $inc --parallelism "$p" --seeds "$seeds" 2>/dev/null \
          | grep -v " 0 differ" | sed "s/^/$job $mode $inc p=$p: /"
      done
    done
  done
done
