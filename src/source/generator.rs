//! The deterministic generator: record `i` is `f(i, now_ns)`, subtask `s` of `p` emits indices
//! `s, s + p, s + 2p, …` below the count. Its offset is the next index, recorded in each
//! checkpoint, so a restored job restarts it exactly where the checkpoint left it.

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
            emitted_before: Vec::new(),
        }
    }
}

/// Indices emitted before a change of parallelism: at parallelism `p`, every index `i` below
/// `next[i % p]` was emitted.
type EmittedLayer = (u64, Vec<u64>);

pub(crate) struct GeneratorSubtask<F> {
    f: F,
    next: u64,
    step: u64,
    end: u64,
    rate_per_ns: Option<f64>,
    started_ns: Option<u64>,
    emitted: u64,
    /// After restores at other parallelisms: what earlier runs emitted (skipped now).
    emitted_before: Vec<EmittedLayer>,
}

impl<F> GeneratorSubtask<F> {
    /// Whether an earlier run, at another parallelism, already emitted index `i`.
    #[inline]
    fn emitted_before(&self, i: u64) -> bool {
        self.emitted_before.iter().any(|(p, next)| i < next[(i % p) as usize])
    }
}

impl<T, F: Fn(u64, u64) -> T + Send> Source<T> for GeneratorSubtask<F> {
    /// The offset is the next index, plus what runs at other parallelisms emitted before a
    /// rescale. (The rate limit restarts from the time of a restore.)
    fn offset(&self) -> Option<Vec<u8>> {
        Some(crate::persist::to_bytes(&(self.next, self.emitted_before.clone())))
    }

    fn seek(&mut self, offset: &[u8]) -> Result<()> {
        let (next, before): (u64, Vec<EmittedLayer>) = crate::persist::from_bytes(offset)?;
        if next % self.step != self.next % self.step {
            return Err(crate::Error::Corrupt(format!("generator offset {next} belongs to another subtask")));
        }
        self.next = next;
        self.emitted_before = before;
        Ok(())
    }

    /// At a new parallelism, this subtask walks its own residue class from the start and skips
    /// every index the old subtasks had emitted (one layer per rescale).
    fn seek_rescaled(&mut self, parts: &[(usize, &[u8])], _subtask: usize, _parallelism: usize) -> Result<()> {
        let old: Vec<(u64, Vec<EmittedLayer>)> =
            parts.iter().map(|(_, b)| crate::persist::from_bytes(b)).collect::<Result<_>>()?;
        let p = old.len() as u64;
        if parts.iter().enumerate().any(|(i, (s, _))| *s != i) {
            return Err(crate::Error::Corrupt("generator offsets are missing a subtask".into()));
        }
        for (s, (next, _)) in old.iter().enumerate() {
            if next % p != s as u64 % p {
                return Err(crate::Error::Corrupt(format!(
                    "generator offset {next} does not belong to subtask {s} of {p}"
                )));
            }
        }
        let mut layers = old.first().map(|(_, l)| l.clone()).unwrap_or_default();
        layers.push((p, old.iter().map(|(next, _)| *next).collect()));
        self.emitted_before = layers;
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
            // A huge rate saturates the cast at u64::MAX: due then means "no limit", not 0.
            let due = (((now - start) as f64 * rate) as u64).saturating_add(1);
            n = n.min(due.saturating_sub(self.emitted));
            if n == 0 {
                return Ok(SourcePoll::Idle);
            }
        }
        if self.emitted_before.is_empty() {
            let (first, step, f) = (self.next, self.step, &self.f);
            out.extend((0..n).map(|k| f(first + k * step, now)));
            self.next += n * step;
            self.emitted += n;
        } else {
            // After a rescale: skip what the earlier runs emitted.
            let mut taken = 0;
            while taken < n && self.next < self.end {
                let i = self.next;
                self.next += self.step;
                if !self.emitted_before(i) {
                    out.push((self.f)(i, now));
                    taken += 1;
                }
            }
            self.emitted += taken;
        }
        Ok(SourcePoll::Emitted)
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([F] Generator<F>);

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

    /// Emits everything left from `gens`, each polled to the end.
    fn drain<F: Fn(u64, u64) -> u64 + Send>(gens: &mut [GeneratorSubtask<F>], ctx: &TaskContext) -> Vec<u64> {
        let mut out = Vec::new();
        for g in gens {
            while g.poll(ctx, &mut out, 3).unwrap() != SourcePoll::Finished {}
        }
        out
    }

    #[test]
    fn rescaled_generators_emit_every_index_exactly_once() {
        let ctx = TaskContext::for_test("gen", 0, 1);
        let gen = Generator::new(|i, _| i).count(1000);
        // 2 subtasks emit a little each, then 4 take over, then 1.
        let mut two: Vec<_> = (0..2).map(|s| gen.clone().subtask(s, 2)).collect();
        let mut seen = Vec::new();
        for (s, g) in two.iter_mut().enumerate() {
            g.poll(&ctx, &mut seen, 50 + s * 40).unwrap();
        }
        let offsets: Vec<Vec<u8>> = two.iter().map(|g| Source::<u64>::offset(g).unwrap()).collect();
        let parts: Vec<(usize, &[u8])> = offsets.iter().enumerate().map(|(s, b)| (s, b.as_slice())).collect();
        let mut four: Vec<_> = (0..4).map(|s| gen.clone().subtask(s, 4)).collect();
        for (s, g) in four.iter_mut().enumerate() {
            Source::<u64>::seek_rescaled(g, &parts, s, 4).unwrap();
            g.poll(&ctx, &mut seen, 30 + s * 7).unwrap();
        }
        let offsets: Vec<Vec<u8>> = four.iter().map(|g| Source::<u64>::offset(g).unwrap()).collect();
        let parts: Vec<(usize, &[u8])> = offsets.iter().enumerate().map(|(s, b)| (s, b.as_slice())).collect();
        let mut one = vec![gen.clone().subtask(0, 1)];
        Source::<u64>::seek_rescaled(&mut one[0], &parts, 0, 1).unwrap();
        seen.extend(drain(&mut one, &ctx));
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).collect::<Vec<_>>(), "every index once across 2 → 4 → 1");
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
