//! The deterministic generator: record `i` is `f(i, now_ns)`, subtask `s` of `p` emits indices
//! `s, s + p, s + 2p, …` below the count. Its offset is the next index, so it can be restarted
//! from any position (the checkpoint issue records that offset).

use super::{Source, SourcePoll};
use crate::context::TaskContext;
use crate::error::Result;

/// A deterministic generator of records, optionally bounded and rate-limited.
///
/// The function receives the record's index and the job clock's time of emission in
/// nanoseconds (for latency measurements; deterministic jobs ignore it).
///
/// ```
/// use weir::source::Generator;
/// let g = Generator::new(|i: u64, _now_ns: u64| i * 2).count(1000).rate(1_000_000.0);
/// # let _ = g;
/// ```
#[derive(Clone)]
pub struct Generator<F> {
    f: F,
    count: Option<u64>,
    rate_per_s: Option<f64>,
}

impl<F> Generator<F> {
    /// An unbounded generator as fast as the job takes it.
    pub fn new(f: F) -> Self {
        Generator { f, count: None, rate_per_s: None }
    }
    /// Emits indices `0 .. count` in all.
    pub fn count(mut self, count: u64) -> Self {
        self.count = Some(count);
        self
    }
    /// At most this many records per second in all (spread evenly over the subtasks).
    pub fn rate(mut self, records_per_s: f64) -> Self {
        self.rate_per_s = Some(records_per_s);
        self
    }
    /// The configured rate.
    pub fn rate_per_s(&self) -> Option<f64> {
        self.rate_per_s
    }

    pub(crate) fn subtask(self, subtask: usize, parallelism: usize) -> GeneratorSubtask<F> {
        GeneratorSubtask {
            f: self.f,
            next: subtask as u64,
            step: parallelism as u64,
            end: self.count.unwrap_or(u64::MAX),
            rate_per_ns: self.rate_per_s.map(|r| r / parallelism as f64 / 1e9),
            started_ns: None,
            emitted: 0,
        }
    }
}

pub(crate) struct GeneratorSubtask<F> {
    f: F,
    next: u64,
    step: u64,
    end: u64,
    rate_per_ns: Option<f64>,
    started_ns: Option<u64>,
    emitted: u64,
}

impl<F> GeneratorSubtask<F> {
    /// The next index this subtask will emit (its offset).
    #[allow(dead_code)]
    pub(crate) fn offset(&self) -> u64 {
        self.next
    }
}

impl<T, F: Fn(u64, u64) -> T + Send> Source<T> for GeneratorSubtask<F> {
    /// The offset is the next index. (The rate limit restarts from the time of a restore.)
    fn offset(&self) -> Option<Vec<u8>> {
        Some(crate::persist::to_bytes(&self.next))
    }

    fn seek(&mut self, offset: &[u8]) -> Result<()> {
        let next: u64 = crate::persist::from_bytes(offset)?;
        if next % self.step != self.next % self.step {
            return Err(crate::Error::Corrupt(format!("generator offset {next} belongs to another subtask")));
        }
        self.next = next;
        Ok(())
    }

    #[inline]
    fn poll(&mut self, ctx: &TaskContext, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        if self.next >= self.end {
            return Ok(SourcePoll::Finished);
        }
        let now = ctx.now_ns();
        let mut n = ((self.end - self.next).div_ceil(self.step)).min(max as u64);
        if let Some(rate) = self.rate_per_ns {
            let start = *self.started_ns.get_or_insert(now);
            let due = ((now - start) as f64 * rate) as u64 + 1;
            n = n.min(due.saturating_sub(self.emitted));
            if n == 0 {
                return Ok(SourcePoll::Idle);
            }
        }
        let (first, step, f) = (self.next, self.step, &self.f);
        out.extend((0..n).map(|k| f(first + k * step, now)));
        self.next += n * step;
        self.emitted += n;
        Ok(SourcePoll::Emitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtasks_partition_the_indices() {
        let ctx = TaskContext::for_test("gen", 0, 3);
        let mut all = Vec::new();
        for s in 0..3 {
            let mut g = Generator::new(|i, _| i).count(10).subtask(s, 3);
            let mut out = Vec::new();
            while g.poll(&ctx, &mut out, 2).unwrap() != SourcePoll::Finished {}
            all.extend(out);
        }
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn the_rate_limit_holds_records_back() {
        let ctx = TaskContext::for_test("gen", 0, 1);
        let mut g = Generator::new(|i, _| i).rate(1.0).subtask(0, 1);
        let mut out = Vec::new();
        assert_eq!(g.poll(&ctx, &mut out, 100).unwrap(), SourcePoll::Emitted);
        assert_eq!(out.len(), 1, "one record is due at once at 1 record/s");
        assert_eq!(g.poll(&ctx, &mut out, 100).unwrap(), SourcePoll::Idle);
    }
}
