//! The engine's `tracing` events, as an embedding program's own subscriber sees them: the
//! checkpoint lifecycle (triggered, completed, failed with its reason), a restart with its
//! cause, and the checkpoint a restart restored from.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector, StorageFault};
use weir::source::Generator;
use weir::{Job, RunConfig};

/// Every event recorded in this process, as `message field=value …`.
static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Whether events are recorded: only while the test runs (the other tests of the binary, the
/// simulator's thousands of seeds among them, run beside it).
static RECORDING: AtomicBool = AtomicBool::new(false);

/// A subscriber that records every event's fields as text (no spans) while [`RECORDING`].
struct Recorder;

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl tracing::Subscriber for Recorder {
    fn register_callsite(&self, _: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        // Asked again every time: recording starts and stops.
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        RECORDING.load(Ordering::SeqCst)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        EVENTS.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The events of job `job` recorded so far (the subscriber is the process's: other tests'
/// jobs are there too).
fn events_of(job: &str) -> Vec<String> {
    let tag = format!("job={job} ");
    EVENTS.lock().unwrap().iter().filter(|e| e.contains(&tag)).cloned().collect()
}

#[test]
fn an_embedding_program_sees_the_checkpoint_lifecycle_in_its_own_logs() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| tracing::subscriber::set_global_default(Recorder).expect("no other subscriber"));
    const N: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![
        Fault::StorageWrite { checkpoint: 2, error: StorageFault::DiskFull },
        Fault::AtRecord { operator: "sum".into(), nth: N * 3 / 4 },
    ]);
    let config = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(5))
        .tolerable_failed_checkpoints(5)
        .restart(RestartStrategy::FixedDelay { attempts: 2, delay: Duration::from_millis(1) })
        .faults(std::sync::Arc::clone(&faults));
    let job = Job::new("traced").with_parallelism(2).with_checkpointing(config);
    job.generator(Generator::new(|i, _| (i % 10, i)).count(N).rate(20_000.0))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s))
        .named("sum")
        .discard();
    RECORDING.store(true, Ordering::SeqCst);
    let report = job.execute(RunConfig::default().workers(2));
    RECORDING.store(false, Ordering::SeqCst);
    let report = report.unwrap();
    assert_eq!(report.restarts, 1);
    assert_eq!(faults.fired(), 2);
    let events = events_of("traced");
    let has = |what: &str, also: &str| events.iter().any(|e| e.contains(what) && e.contains(also));
    assert!(has("message=checkpoint triggered", "checkpoint=1 "), "{events:#?}");
    assert!(has("message=checkpoint completed", "duration_ms="), "{events:#?}");
    assert!(has("message=checkpoint failed", "checkpoint=2 ") && has("checkpoint=2 ", "No space left"), "{events:#?}");
    assert!(has("message=job restarts", "restart=1 "), "{events:#?}");
    assert!(has("message=restored from checkpoint", "checkpoint="), "{events:#?}");
}
