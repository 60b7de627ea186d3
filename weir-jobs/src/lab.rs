//! The checkpoint lab: several ways of taking barriers (aligned, unaligned, aligned-timeout,
//! adaptive) taking turns checkpoint by checkpoint inside one running job, through its live
//! configuration, so that each is measured under the load of the same moments. Compared in
//! separate runs on a shared machine, two modes' figures move with whatever else ran (2–4×);
//! consecutive checkpoints share the moment, so their ratios hold still.
//!
//! ```no_run
//! use weir_jobs::bench::CheckpointChoice;
//! use weir_jobs::lab::CheckpointLab;
//! # fn f(handle: &weir::JobHandle) -> weir::Result<()> {
//! let mut lab = CheckpointLab::new(
//!     vec![CheckpointChoice::Aligned, CheckpointChoice::Unaligned],
//!     std::time::Duration::from_millis(10),
//!     1 << 19,
//! );
//! // As the job (started with lab.first()'s configuration) runs:
//! lab.tick(handle)?;
//! // When it has ended:
//! print!("{}", CheckpointLab::report(&handle.checkpoint_stats()));
//! # Ok(()) }
//! ```
//!
//! May touch: `bench` (the modes), weir's job handle and statistics.

use std::collections::BTreeMap;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointStats};
use weir::JobHandle;

use crate::bench::CheckpointChoice;

/// Modes taking turns in a running job.
#[derive(Clone, Debug)]
pub struct CheckpointLab {
    modes: Vec<CheckpointChoice>,
    alignment_timeout: Duration,
    inflight_budget: u64,
    /// Checkpoints completed when the mode was last switched.
    switched_at: usize,
}

impl CheckpointLab {
    /// `modes` in turn (aligned, unaligned, aligned-timeout or adaptive: what a running job can
    /// switch between), with `alignment_timeout` for aligned-timeout and `inflight_budget` for
    /// adaptive.
    pub fn new(modes: Vec<CheckpointChoice>, alignment_timeout: Duration, inflight_budget: u64) -> CheckpointLab {
        assert!(!modes.is_empty(), "a lab needs a mode");
        CheckpointLab { modes, alignment_timeout, inflight_budget, switched_at: 0 }
    }

    /// The mode the job starts with.
    pub fn first(&self) -> CheckpointChoice {
        self.modes[0]
    }

    /// `c` taking its barriers as `mode` does (the rest of it kept).
    pub fn switched(&self, c: CheckpointConfig, mode: CheckpointChoice) -> CheckpointConfig {
        let way = mode
            .config(&c.dir, c.interval, self.alignment_timeout, self.inflight_budget)
            .expect("the lab's modes all checkpoint");
        let mut c = c;
        (c.unaligned, c.alignment_timeout, c.inflight_budget) =
            (way.unaligned, way.alignment_timeout, way.inflight_budget);
        c
    }

    /// Called as the job runs: once a checkpoint completed since the last switch, the next
    /// checkpoints go the next mode's way.
    pub fn tick(&mut self, handle: &JobHandle) -> weir::Result<()> {
        let completed = handle.checkpoint_stats().len();
        if completed > self.switched_at {
            self.switched_at = completed;
            let next = self.modes[completed % self.modes.len()];
            handle.update_checkpoints(|c| self.switched(c, next))?;
        }
        Ok(())
    }

    /// Per mode (as each checkpoint records how its barriers went), the checkpoints and the
    /// medians of their duration, alignment and in-flight bytes; then, for each pair of modes,
    /// the ratios of consecutive checkpoints' durations (the later against the earlier, turned
    /// to the same direction), their median and spread.
    pub fn report(stats: &[CheckpointStats]) -> String {
        let mut by_mode: BTreeMap<&str, Vec<&CheckpointStats>> = BTreeMap::new();
        for s in stats {
            by_mode.entry(s.alignment.as_str()).or_default().push(s);
        }
        let mut rows = Vec::new();
        for (mode, of) in &by_mode {
            let median = |f: &dyn Fn(&CheckpointStats) -> f64| median(of.iter().map(|s| f(s)).collect());
            rows.push(vec![
                mode.to_string(),
                of.len().to_string(),
                format!("{:.2} ms", median(&|s| s.duration_ms)),
                format!("{:.2} ms", median(&|s| s.alignment_ms)),
                weir::metrics::group_digits(median(&|s| s.inflight_bytes as f64) as u64),
            ]);
        }
        let mut out = weir::checkpoint::table(
            &["mode", "checkpoints", "median duration", "median alignment", "median in-flight bytes"],
            &rows,
        );
        // Consecutive checkpoints of two modes, the ratio always `b ÷ a` for modes a < b.
        let mut ratios: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
        for pair in stats.windows(2) {
            let (x, y) = (&pair[0], &pair[1]);
            if x.alignment == y.alignment || x.duration_ms <= 0.0 || y.duration_ms <= 0.0 {
                continue;
            }
            let (a, b) = if x.alignment < y.alignment { (x, y) } else { (y, x) };
            ratios.entry((a.alignment.as_str(), b.alignment.as_str())).or_default().push(b.duration_ms / a.duration_ms);
        }
        let rows: Vec<Vec<String>> = ratios
            .into_iter()
            .map(|((a, b), mut r)| {
                r.sort_by(f64::total_cmp);
                let at = |q: f64| r[((r.len() - 1) as f64 * q).round() as usize];
                vec![
                    format!("{b} ÷ {a}"),
                    r.len().to_string(),
                    format!("{:.3}", at(0.5)),
                    format!("{:.3}–{:.3}", at(0.1), at(0.9)),
                ]
            })
            .collect();
        if !rows.is_empty() {
            out.push_str("duration ratios of consecutive checkpoints (each pair under the same moment's load):\n");
            out.push_str(&weir::checkpoint::table(&["modes", "pairs", "median ratio", "p10–p90"], &rows));
        }
        out
    }
}

/// The median of `v` (0 for none).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(id: u64, alignment: &str, duration_ms: f64) -> CheckpointStats {
        CheckpointStats { id, alignment: alignment.into(), duration_ms, ..Default::default() }
    }

    #[test]
    fn modes_are_reported_apart_and_consecutive_pairs_as_ratios() {
        let stats = vec![
            stat(1, "aligned", 100.0),
            stat(2, "unaligned", 10.0),
            stat(3, "aligned", 200.0),
            stat(4, "unaligned", 20.0),
            stat(5, "aligned", 300.0),
        ];
        let report = CheckpointLab::report(&stats);
        assert!(report.contains("|   aligned |           3 |       200.00 ms |"), "{report}");
        assert!(report.contains("| unaligned |           2 |        15.00 ms |"), "{report}");
        // Pairs 100/10, 10/200, 200/20, 20/300: ratios 0.1, 0.05, 0.1, 0.0667 (median 0.1).
        assert!(report.contains("| unaligned ÷ aligned |     4 |        0.100 |"), "{report}");
    }

    #[test]
    fn switching_keeps_the_rest_of_the_configuration() {
        let lab = CheckpointLab::new(
            vec![CheckpointChoice::Aligned, CheckpointChoice::Adaptive],
            Duration::from_millis(10),
            1234,
        );
        let c = CheckpointConfig::new("/tmp/x").interval(Duration::from_millis(77)).retain(5);
        let adaptive = lab.switched(c.clone(), CheckpointChoice::Adaptive);
        assert!(adaptive.unaligned && adaptive.inflight_budget == Some(1234));
        assert_eq!((adaptive.interval, adaptive.retained), (Duration::from_millis(77), 5));
        let back = lab.switched(adaptive, CheckpointChoice::Aligned);
        assert!(!back.unaligned && back.inflight_budget.is_none() && back.alignment_timeout.is_none());
    }
}
