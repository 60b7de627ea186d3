//! The checkpoint lab: several ways of taking barriers (aligned, unaligned, aligned-timeout,
//! adaptive) taking turns checkpoint by checkpoint inside one running job, through its live
//! configuration, so that each is measured under the load of the same moments. Compared in
//! separate runs on a shared machine, two modes' figures move with whatever else ran (2–4×);
//! consecutive checkpoints share the moment, so their ratios hold still.
//!
//! ```no_run
//! use weir::checkpoint::CheckpointMode;
//! use weir_ops::lab::CheckpointLab;
//! # fn f(handle: &weir::JobHandle) -> weir::Result<()> {
//! let lab = CheckpointLab::new(vec![CheckpointMode::Aligned, CheckpointMode::Adaptive { budget: 1 << 19 }]);
//! // Once the job (started with lab.first()'s configuration) runs:
//! lab.start(handle)?;
//! // When it has ended: per mode its medians, per pair of modes the ratios.
//! let summary = CheckpointLab::summary(&handle.checkpoint_stats());
//! for r in &summary.ratios {
//!     println!("{} ÷ {}: {:.3} over {} pairs", r.numerator, r.denominator, r.median, r.pairs);
//! }
//! # Ok(()) }
//! ```
//!
//! May touch: weir's checkpoint modes, job handle and statistics.

use std::collections::BTreeMap;

use weir::checkpoint::{CheckpointMode, CheckpointStats};
use weir::JobHandle;

/// Modes taking turns in a running job.
#[derive(Clone, Debug)]
pub struct CheckpointLab {
    modes: Vec<CheckpointMode>,
}

impl CheckpointLab {
    /// `modes` in turn (aligned, unaligned, aligned-timeout or adaptive: what a running job can
    /// switch between), each with its parameter.
    pub fn new(modes: Vec<CheckpointMode>) -> CheckpointLab {
        assert!(!modes.is_empty(), "a lab needs a mode");
        CheckpointLab { modes }
    }

    /// The mode the job starts with.
    pub fn first(&self) -> CheckpointMode {
        self.modes[0]
    }

    /// Hands the modes to the running job's coordinator, which takes the next one as it
    /// triggers each checkpoint: consecutive checkpoints go consecutive modes' ways however
    /// fast they come (picking by the completed count once per supervise tick repeated a mode
    /// whenever two checkpoints fell in one tick).
    pub fn start(&self, handle: &JobHandle) -> weir::Result<()> {
        handle.checkpoints_in_turn(|c| self.modes.iter().map(|m| c.clone().mode(*m)).collect())
    }

    /// Per mode (as each checkpoint records how its barriers went), the checkpoints and the
    /// medians of their duration, alignment and in-flight bytes; then, for each pair of modes,
    /// the ratios of consecutive checkpoints' durations (the later against the earlier, turned
    /// to the same direction), their median and spread.
    pub fn summary(stats: &[CheckpointStats]) -> LabSummary {
        // By name, as reports list them (and each ratio's direction follows).
        let name = |s: &CheckpointStats| s.mode.map_or("savepoint", |m| m.kind().name());
        let mut by_mode: BTreeMap<&str, Vec<&CheckpointStats>> = BTreeMap::new();
        for s in stats {
            by_mode.entry(name(s)).or_default().push(s);
        }
        let modes = by_mode
            .iter()
            .map(|(mode, of)| {
                let median = |f: &dyn Fn(&CheckpointStats) -> f64| median(of.iter().map(|s| f(s)).collect());
                ModeSummary {
                    mode: mode.to_string(),
                    checkpoints: of.len(),
                    median_duration_ms: median(&|s| s.duration_ms),
                    median_alignment_ms: median(&|s| s.alignment_ms),
                    median_inflight_bytes: median(&|s| s.inflight_bytes as f64),
                }
            })
            .collect();
        // Consecutive checkpoints of two modes, the ratio always `b ÷ a` for modes a < b.
        let mut ratios: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
        for pair in stats.windows(2) {
            let (x, y) = (&pair[0], &pair[1]);
            if name(x) == name(y) || x.duration_ms <= 0.0 || y.duration_ms <= 0.0 {
                continue;
            }
            let (a, b) = if name(x) < name(y) { (x, y) } else { (y, x) };
            ratios.entry((name(a), name(b))).or_default().push(b.duration_ms / a.duration_ms);
        }
        let ratios = ratios
            .into_iter()
            .map(|((a, b), mut r)| {
                r.sort_by(f64::total_cmp);
                let at = |q: f64| r[((r.len() - 1) as f64 * q).round() as usize];
                PairRatios {
                    numerator: b.to_string(),
                    denominator: a.to_string(),
                    pairs: r.len(),
                    median: at(0.5),
                    p10: at(0.1),
                    p90: at(0.9),
                }
            })
            .collect();
        LabSummary { modes, ratios }
    }
}

/// What the checkpoint lab found ([`CheckpointLab::summary`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LabSummary {
    /// Per mode, in name order.
    pub modes: Vec<ModeSummary>,
    /// Per pair of modes that followed each other, in name order.
    pub ratios: Vec<PairRatios>,
}

/// One mode's checkpoints in the lab.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeSummary {
    /// How its barriers went (the checkpoints' `alignment`).
    pub mode: String,
    /// Its checkpoints.
    pub checkpoints: usize,
    /// Their median duration, trigger to completion.
    pub median_duration_ms: f64,
    /// Their median alignment.
    pub median_alignment_ms: f64,
    /// Their median in-flight bytes.
    pub median_inflight_bytes: f64,
}

/// The duration ratios of consecutive checkpoints of two modes, `numerator ÷ denominator`.
#[derive(Clone, Debug, PartialEq)]
pub struct PairRatios {
    /// The mode above.
    pub numerator: String,
    /// The mode below.
    pub denominator: String,
    /// Consecutive pairs.
    pub pairs: usize,
    /// The median ratio.
    pub median: f64,
    /// The 10th percentile.
    pub p10: f64,
    /// The 90th percentile.
    pub p90: f64,
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
    use std::time::Duration;

    use weir::checkpoint::ModeKeys;

    use super::*;

    fn stat(id: u64, alignment: &str, duration_ms: f64) -> CheckpointStats {
        let kind: weir::checkpoint::ModeKind = alignment.parse().unwrap();
        let mode = CheckpointMode::from_flat(ModeKeys::word(kind, Duration::from_millis(10), 1 << 20)).unwrap();
        CheckpointStats { id, mode: Some(mode), duration_ms, ..Default::default() }
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
        let summary = CheckpointLab::summary(&stats);
        let per_mode: Vec<_> =
            summary.modes.iter().map(|m| (m.mode.as_str(), m.checkpoints, m.median_duration_ms)).collect();
        assert_eq!(per_mode, [("aligned", 3, 200.0), ("unaligned", 2, 15.0)]);
        // Pairs 100/10, 10/200, 200/20, 20/300: ratios 0.1, 0.05, 0.1, 0.0667 (median 0.1).
        let [r] = &summary.ratios[..] else { panic!("one pair of modes: {summary:?}") };
        assert_eq!((r.numerator.as_str(), r.denominator.as_str(), r.pairs), ("unaligned", "aligned", 4));
        assert!((r.median - 0.1).abs() < 1e-9 && (r.p10 - 0.05).abs() < 1e-9, "{r:?}");
    }
}
