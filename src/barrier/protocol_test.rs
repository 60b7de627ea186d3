//! The barrier protocol at one task, on real rings and a real snapshot writer: concurrent
//! unaligned checkpoints (a user saw 127 checkpoints declined as "superseded" in one run of
//! two at a time), and adaptive alignment under an in-flight budget.

use std::sync::mpsc::{channel as mpsc, Receiver, Sender};
use std::sync::Arc;

use super::*;
use crate::channel::{channel, GatePoll, Parker};
use crate::checkpoint::task::{SnapshotWrite, SnapshotWriter, TaskAck, TaskControl};
use crate::collector::Nowhere;

/// Runs each snapshot write as it is submitted and hands on its acknowledgement.
struct InlineWriter(Sender<TaskAck>);

impl SnapshotWriter for InlineWriter {
    fn submit(&self, write: SnapshotWrite) -> std::result::Result<(), SnapshotWrite> {
        if let Some(ack) = write() {
            self.0.send(ack).expect("the test holds the receiver");
        }
        Ok(())
    }
    fn limit_writes(&self) -> usize {
        usize::MAX
    }
    fn wait_idle(&self, _: std::time::Duration) -> bool {
        true
    }
}

/// A chain whose one operator keeps a byte of state, recording the barriers it forwards.
#[derive(Default)]
struct Forwarded(Vec<u64>);

impl ChainHead for Forwarded {
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.0.push(barrier.id);
        snapshot.add("op".into(), 0, Box::new(crate::snapshot::RawBytes(vec![barrier.id as u8])));
        Ok(())
    }
    fn notify(&mut self, _: CheckpointNotice) -> Result<()> {
        Ok(())
    }
}

/// An unaligned task with `channels` inputs writing into `dir`; the acknowledgements come out
/// of the receiver (the control sender must stay alive).
fn unaligned_task(
    dir: &std::path::Path,
    channels: usize,
) -> (TaskCheckpointing, Receiver<TaskAck>, Sender<TaskControl>) {
    adaptive_task(dir, channels, None)
}

/// [`unaligned_task`], aligning adaptively under an in-flight budget of `budget` bytes.
fn adaptive_task(
    dir: &std::path::Path,
    channels: usize,
    budget: Option<u64>,
) -> (TaskCheckpointing, Receiver<TaskAck>, Sender<TaskControl>) {
    let mode = budget.map_or(CheckpointMode::Unaligned, |budget| CheckpointMode::Adaptive { budget });
    let config = crate::checkpoint::CheckpointConfig::new(dir).mode(mode);
    let live = LiveSettings::new(&config);
    live.set_channels(channels);
    let (acks_tx, acks) = mpsc();
    let (control_tx, control) = mpsc();
    let cp = TaskCheckpointing {
        task: 0,
        mode: CheckpointMode::Aligned,
        unaligned: true,
        sliced: false,
        activity: activity::ActivityReport::new(Arc::default(), Clock::manual(Arc::default())),
        pending_unaligned: Vec::new(),
        unaligned_done: 0,
        control,
        acks: acks_tx.clone(),
        storage: Arc::new(CheckpointStorage::new(dir)),
        writer: Arc::new(InlineWriter(acks_tx)),
        pages: None,
        pages_apart_in_full: false,
        local: None,
        faults: None,
        clock: Clock::manual(Arc::default()),
        aligner: BarrierAligner::new(channels),
        live: Arc::new(live),
        deferred: None,
        commits: Arc::default(),
        parts: Arc::default(),
    };
    (cp, acks, control_tx)
}

fn unaligned(id: u64) -> Barrier {
    Barrier { id, trigger_ns: 0, unaligned: true, savepoint: false }
}

/// Checkpoint 2's barrier reaches a task (on channel 0) while checkpoint 1's in-flight data
/// on channel 1 is still being captured. Both snapshot, in order; checkpoint 1 keeps its
/// capture (channel 1's records read after its snapshot) and neither is declined.
#[test]
fn a_newer_unaligned_barrier_passes_an_older_capture_without_declining_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cp, acks, _control) = unaligned_task(dir.path(), 2);
    for id in [1, 2] {
        // What the coordinator does when it triggers a checkpoint.
        std::fs::create_dir_all(cp.storage.checkpoint_dir(id)).unwrap();
    }
    let parker = Arc::new(Parker::default());
    let (mut ahead, r0) = channel::<u64>(16, Arc::clone(&parker), Arc::clone(&parker));
    let (mut behind, r1) = channel::<u64>(16, Arc::clone(&parker), parker);
    let mut gate = InputGate::new(vec![r0, r1]);
    gate.set_unaligned(true);
    let ident = TaskIdent { name: "op (1/1)".into(), operator: "op".into(), subtask: 0 };
    let mut head = Forwarded::default();
    let run = |cp: &mut TaskCheckpointing, gate: &mut InputGate<u64>, head: &mut Forwarded| loop {
        match gate.poll(&mut Nowhere, 16).unwrap() {
            GatePoll::PriorityBarrier { channel, barrier, seq } => {
                on_priority(cp, gate, &ident, channel, barrier, seq, head).unwrap()
            }
            GatePoll::Idle => break,
            GatePoll::Progress => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    behind.write_records(&mut vec![10, 11]);
    ahead.write_priority(unaligned(1));
    ahead.write_priority(unaligned(2));
    run(&mut cp, &mut gate, &mut head);
    assert_eq!(head.0, vec![1, 2], "both snapshotted, in checkpoint order");
    assert!(acks.try_recv().is_err(), "nothing complete yet: channel 1's barriers are still to come");
    behind.write_priority(unaligned(1));
    behind.write_records(&mut vec![12]);
    behind.write_priority(unaligned(2));
    run(&mut cp, &mut gate, &mut head);
    let mut done: Vec<(u64, u64)> = acks
        .try_iter()
        .map(|a| match a.result {
            Ok(d) => (a.checkpoint, d.stats.inflight_bytes),
            Err(e) => panic!("checkpoint {} declined: {e}", a.checkpoint),
        })
        .collect();
    done.sort();
    assert_eq!(done.iter().map(|d| d.0).collect::<Vec<_>>(), vec![1, 2], "{done:?}");
    assert!(done[0].1 > 0, "checkpoint 1 captured channel 1's records read after its snapshot");
    assert!(cp.pending_unaligned.is_empty());
}

/// The user's case: a task with a long backlog on one channel and a short one on the other.
/// Unaligned, the checkpoint stores both backlogs (378 bytes here); under a budget of 100
/// bytes (50 per channel) the snapshot waits while the task works the long backlog down,
/// the short one is read up to its barrier (aligned), and what is stored stays under budget.
#[test]
fn an_in_flight_budget_aligns_what_fits_and_captures_the_rest_under_it() {
    for budget in [None, Some(100)] {
        let dir = tempfile::tempdir().unwrap();
        let (mut cp, acks, _control) = adaptive_task(dir.path(), 2, budget);
        std::fs::create_dir_all(cp.storage.checkpoint_dir(1)).unwrap();
        let parker = Arc::new(Parker::default());
        let (mut long, r0) = channel::<u64>(64, Arc::clone(&parker), Arc::clone(&parker));
        let (mut short, r1) = channel::<u64>(64, Arc::clone(&parker), parker);
        let mut gate = InputGate::new(vec![r0, r1]);
        gate.set_unaligned(true);
        let ident = TaskIdent { name: "op (1/1)".into(), operator: "op".into(), subtask: 0 };
        let mut head = Forwarded::default();
        long.write_records(&mut (0..40).collect());
        short.write_records(&mut vec![100, 101]);
        long.write_priority(unaligned(1));
        short.write_priority(unaligned(1));
        // A few records per poll, so the budget is met before the backlog is gone.
        loop {
            match gate.poll(&mut Nowhere, 4).unwrap() {
                GatePoll::PriorityBarrier { channel, barrier, seq } => {
                    on_priority(&mut cp, &mut gate, &ident, channel, barrier, seq, &mut head).unwrap()
                }
                GatePoll::Progress => on_poll(&mut cp, &mut gate, &ident, &mut head).unwrap(),
                GatePoll::Idle => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(head.0, vec![1], "snapshotted once");
        let done = match acks.try_recv().expect("checkpoint 1 is complete").result {
            Ok(d) => d,
            Err(e) => panic!("declined: {e}"),
        };
        let inflight = done.stats.inflight_bytes;
        match budget {
            None => {
                assert!(inflight > 300, "unaligned stores both backlogs: {inflight} bytes");
                assert!(done.stats.channels.is_empty(), "no per-channel choice without a budget");
            }
            Some(b) => {
                assert!(inflight > 0 && inflight <= b, "{inflight} bytes in flight, budget {b}");
                let [long, short] = &done.stats.channels[..] else { panic!("{:?}", done.stats.channels) };
                assert!(!long.aligned && long.bytes > 0 && long.bytes <= b / 2, "{long:?}");
                assert!(short.aligned && short.bytes == 0, "{short:?}");
            }
        }
    }
}

/// Resumable partial checkpoints at one task: once the coordinator kept the task's part of
/// failed checkpoint 1, checkpoint 2 reuses it while the state is the same (the file, linked,
/// carries checkpoint 1's identity; nothing is written), and checkpoint 3, after a write to
/// one key, writes again and says what changed. With incremental checkpoints that write
/// refers to the kept part's pages and writes only the changed page.
#[test]
fn a_kept_part_is_reused_while_nothing_changed_and_says_what_did_after() {
    use crate::checkpoint::{read_expected, FileIdentity, FileKind};
    use crate::state::{KeyedValueState, Snapshot};
    for incremental in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (mut cp, acks, _control) = unaligned_task(dir.path(), 1);
        if incremental {
            cp.pages = Some(Arc::default());
        }
        let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..20_000 {
            state.put(k, k);
        }
        let write = |cp: &TaskCheckpointing, id: u64, state: &mut KeyedValueState<u64, u64>| {
            cp.storage.prepare(id).unwrap();
            let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
            snap.add("counts".into(), 0, state.fork());
            cp.write_async(snap, TaskStats::default());
            let ack = acks.try_recv().expect("written inline");
            assert_eq!(ack.checkpoint, id);
            ack.result.unwrap_or_else(|e| panic!("checkpoint {id} declined: {e}"))
        };
        let first = write(&cp, 1, &mut state);
        assert!(first.stats.not_reused.is_none() && first.stats.reused_from.is_none());
        // Checkpoint 1 expired, and the coordinator kept this part.
        cp.keep_part(1);
        apply_notice(&mut cp, CheckpointNotice::Aborted(1), &mut |_| Ok(())).unwrap();
        let second = write(&cp, 2, &mut state);
        assert_eq!((second.stats.reused_from, second.written_for), (Some(1), Some(1)), "incremental {incremental}");
        assert_eq!((second.digest, second.stats.written_bytes), (first.digest, 0));
        assert_eq!(second.stats.state_bytes, first.stats.state_bytes);
        let identity = FileIdentity::new(FileKind::TaskState, cp.storage.fingerprint(), 1, Some(0));
        read_expected(&cp.storage.checkpoint_dir(2).join(&second.file), &identity, Some(&second.digest)).unwrap();
        state.put(7, 0);
        let third = write(&cp, 3, &mut state);
        assert!(third.stats.reused_from.is_none() && third.written_for.is_none());
        let why = third.stats.not_reused.as_deref().unwrap_or_default();
        assert!(why.starts_with("changed since checkpoint 1: counts subtask 0: 1 of "), "{why}");
        if incremental {
            let (written, all) = (third.stats.written_bytes, third.stats.state_bytes);
            assert!(written * 50 < all, "wrote {written} of {all} bytes: the kept pages are referred to");
            assert!(third.shared.iter().any(|s| s.file == CheckpointStorage::shared_name(1, 0)));
        } else {
            assert_eq!(third.stats.written_bytes, third.stats.state_bytes);
        }
        // Checkpoint 4 failed, and the coordinator kept other tasks' parts of it, not this
        // one's: it no longer keeps the part of 1 (its files go), so checkpoint 5 neither
        // reuses it nor refers to its pages (a checkpoint referring to them would fail, and
        // so would every later one).
        apply_notice(&mut cp, CheckpointNotice::Aborted(4), &mut |_| Ok(())).unwrap();
        let fifth = write(&cp, 5, &mut state);
        assert!(fifth.stats.reused_from.is_none() && fifth.stats.not_reused.is_none());
        assert!(fifth.shared.iter().all(|s| s.file != CheckpointStorage::shared_name(1, 0)), "{:?}", fifth.shared);
    }
}

/// A user's checkpoint lab (aligned and unaligned taking turns in one job, on records of
/// 100 µs each) saw its unaligned checkpoints take 240 ms: a job that started aligned handed
/// records on a chunk at a time (1024 of them: 102 ms), so its first priority barrier waited
/// for the chunk. Turned on while the job runs, unaligned checkpoints slice the records at the
/// task's next poll, and the first slice is one record long, so a barrier waits for a slice of
/// work even in the middle of a backlog.
#[test]
fn turning_unaligned_on_while_running_slices_a_backlog_of_slow_records() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cp, _acks, _control) = unaligned_task(dir.path(), 1);
    let time = Arc::new(std::sync::atomic::AtomicU64::new(0));
    cp.clock = Clock::manual(Arc::clone(&time));
    cp.live = Arc::new(LiveSettings::new(&crate::checkpoint::CheckpointConfig::new(dir.path())));
    let parker = Arc::new(Parker::default());
    let (mut out, reader) = channel::<u64>(1024, Arc::clone(&parker), parker);
    let mut gate = InputGate::new(vec![reader]);
    gate.set_unaligned(true);
    let ident = TaskIdent { name: "op (1/1)".into(), operator: "op".into(), subtask: 0 };
    out.write_records(&mut (0..1000).collect());
    out.flush();

    cp.live.apply(&crate::checkpoint::CheckpointConfig::new(dir.path()).mode(CheckpointMode::Unaligned));
    before_poll(&mut cp, &mut gate, &ident, &mut Forwarded::default()).unwrap();
    assert!(cp.sliced, "the task follows the live configuration");

    // Each record costs 100 µs of (simulated) time; once ten are done an unaligned barrier
    // comes.
    let done = std::sync::Mutex::new(0usize);
    let publish = std::sync::Mutex::new(Some(&mut out));
    let mut head = crate::collector::OnBatch(|r: &mut Vec<u64>| {
        time.fetch_add(100_000 * r.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut done = done.lock().unwrap();
        *done += r.len();
        if *done >= 10 {
            if let Some(out) = publish.lock().unwrap().take() {
                out.write_priority(unaligned(1));
            }
        }
    });
    let mut polls = 0;
    let polled = loop {
        polls += 1;
        assert!(polls < 100, "the barrier never overtook");
        match gate.poll(&mut head, 1024).unwrap() {
            GatePoll::Progress => {}
            other => break other,
        }
    };
    assert!(matches!(polled, GatePoll::PriorityBarrier { seq: 1000, .. }), "{polled:?}");
    let done = *done.lock().unwrap();
    assert!(done <= 11, "the barrier waited for {done} records of 100 µs, not a slice of them");
}

/// A user of incremental checkpoints asked for a full one (Flink's `flink checkpoint --full`)
/// and had no way to: a checkpoint marked full writes every page and refers to no earlier
/// checkpoint's file, and the next incremental one refers to its pages, not the older ones.
#[test]
fn a_checkpoint_asked_for_in_full_refers_to_nothing_earlier() {
    use crate::state::{KeyedValueState, Snapshot};
    let dir = tempfile::tempdir().unwrap();
    let (mut cp, acks, _control) = unaligned_task(dir.path(), 1);
    cp.pages = Some(Arc::default());
    cp.live = Arc::new(LiveSettings::new(&crate::checkpoint::CheckpointConfig::new(dir.path())));
    let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
    for k in 0..20_000 {
        state.put(k, k);
    }
    let write = |cp: &mut TaskCheckpointing, id: u64, state: &mut KeyedValueState<u64, u64>| {
        cp.storage.prepare(id).unwrap();
        let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
        snap.add("counts".into(), 0, state.fork());
        cp.write_async(snap, TaskStats::default());
        let ack = acks.try_recv().expect("written inline").result.unwrap();
        apply_notice(cp, CheckpointNotice::Complete(id), &mut |_| Ok(())).unwrap();
        ack
    };
    let first = write(&mut cp, 1, &mut state);
    state.put(7, 0);
    let second = write(&mut cp, 2, &mut state);
    assert!(second.stats.written_bytes * 50 < second.stats.state_bytes, "incremental: the unchanged pages referred to");
    assert!(second.shared.iter().any(|s| s.file == CheckpointStorage::shared_name(1, 0)));
    cp.live.mark_full(3);
    let third = write(&mut cp, 3, &mut state);
    assert_eq!(third.stats.written_bytes, third.stats.state_bytes, "a full checkpoint writes every page");
    let only_its_own: Vec<_> = third.shared.iter().map(|s| s.file.clone()).collect();
    assert_eq!(only_its_own, [CheckpointStorage::shared_name(3, 0)], "it refers to no earlier checkpoint");
    state.put(8, 0);
    let fourth = write(&mut cp, 4, &mut state);
    assert!(fourth.shared.iter().all(|s| s.file != CheckpointStorage::shared_name(1, 0)), "{:?}", fourth.shared);
    assert!(fourth.shared.iter().any(|s| s.file == CheckpointStorage::shared_name(3, 0)));
    assert_eq!(first.stats.state_bytes, third.stats.state_bytes);
}
