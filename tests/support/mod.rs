//! Helpers the job-level tests of process functions and windows share.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir::sink::CommittedOutput;
use weir::source::Generator;
use weir::JobHandle;

/// The committed records, sorted.
pub fn sorted<T: Ord + Clone>(out: &CommittedOutput<T>) -> Vec<T> {
    let mut v = out.records();
    v.sort_unstable();
    v
}

/// `g`, limited to `rate` events per second if given.
pub fn at_rate<F>(g: Generator<F>, rate: Option<f64>) -> Generator<F> {
    match rate {
        Some(r) => g.rate(r),
        None => g,
    }
}

/// Stops the job with a savepoint in `dir` once its sources have emitted `records` (so the
/// stop falls mid-run however fast the machine is); returns the savepoint.
pub fn savepoint_after(handle: JobHandle, records: u64, dir: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(60);
    while handle.metrics().source_records() < records {
        assert!(Instant::now() < deadline, "the job never emitted {records} records");
        std::thread::sleep(Duration::from_millis(1));
    }
    handle.stop_with_savepoint(dir).unwrap().savepoint().expect("a savepoint, not the end of the input")
}
