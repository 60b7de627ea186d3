//! The checkpoint lab's attribution: a job whose alignment is held 50 ms (one source subtask
//! takes 50 ms to hand over its offset, so its barrier comes 50 ms after the other's, whose
//! channel waits blocked) attributes its slow latency samples to aligning. Checked by where the
//! slow samples land, not by how long anything took.

use std::time::Duration;

use weir::checkpoint::CheckpointConfig;
use weir::context::TaskContext;
use weir::metrics::LatencyCause;
use weir::source::{Source, SourcePoll};
use weir::{Job, RunConfig};

/// Records `(created_ns, index)`, one every 20 µs of the job clock, for `until_ns`; subtask 1
/// takes 50 ms over each offset.
struct Paced {
    holds: bool,
    next_ns: u64,
    until_ns: u64,
    emitted: u64,
}

const HOLD: Duration = Duration::from_millis(50);

impl Source<(u64, u64)> for Paced {
    fn poll(&mut self, ctx: &TaskContext, out: &mut Vec<(u64, u64)>, max: usize) -> weir::Result<SourcePoll> {
        let now = ctx.now_ns();
        if self.next_ns >= self.until_ns {
            return Ok(SourcePoll::Finished);
        }
        while self.next_ns <= now && out.len() < max && self.next_ns < self.until_ns {
            out.push((now, self.emitted));
            self.emitted += 1;
            self.next_ns += 20_000;
        }
        Ok(if out.is_empty() { SourcePoll::Idle } else { SourcePoll::Emitted })
    }

    fn offset(&self) -> Option<Vec<u8>> {
        if self.holds && self.emitted > 0 {
            // The seam: this subtask's barrier leaves 50 ms late (a source slow to say where it
            // is), so the subtask downstream aligns that long.
            std::thread::sleep(HOLD);
        }
        Some(self.emitted.to_le_bytes().to_vec())
    }
}

#[test]
fn a_held_alignment_gets_the_slow_samples() {
    let dir = tempfile::tempdir().unwrap();
    let config = CheckpointConfig::new(dir.path()).interval(Duration::from_millis(200));
    let job = Job::new("held alignment").with_parallelism(2).with_checkpointing(config);
    job.source(|ctx: &TaskContext| {
        Ok(Paced { holds: ctx.subtask == 1, next_ns: ctx.now_ns(), until_ns: ctx.now_ns() + 1_500_000_000, emitted: 0 })
    })
    .named("paced")
    .rebalance()
    .measure_latency(|r: &(u64, u64)| r.0)
    .discard();
    let report = job.execute(RunConfig::default().workers(2)).unwrap();
    assert!(report.checkpoints.len() >= 2, "{} checkpoints", report.checkpoints.len());
    let slow_ns = (HOLD.as_nanos() as u64) * 4 / 5;
    let slow: Vec<(LatencyCause, u64)> = report
        .latency_by_cause
        .iter()
        .map(|(cause, h)| {
            (*cause, h.iter_recorded().filter(|v| v.value_iterated_to() >= slow_ns).map(|v| v.count_at_value()).sum())
        })
        .collect();
    let count = |c: LatencyCause| slow.iter().find(|(x, _)| *x == c).map_or(0, |(_, n)| *n);
    let all: u64 = slow.iter().map(|(_, n)| n).sum();
    assert!(count(LatencyCause::Aligning) > 0, "records held by the alignment waited 40 ms or more: {slow:?}");
    assert!(
        count(LatencyCause::Aligning) * 2 > all,
        "most samples of 40 ms or more are the alignment's (a loaded machine may add a few others): {slow:?}"
    );
}
