//! The barrier protocol at one task, on real rings and a real snapshot writer: concurrent
//! unaligned checkpoints (a user saw 127 checkpoints declined as "superseded" in one run of
//! two at a time).

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
        self.0.send(write()).expect("the test holds the receiver");
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
    let (acks_tx, acks) = mpsc();
    let (control_tx, control) = mpsc();
    let cp = TaskCheckpointing {
        task: 0,
        mode: CheckpointMode::ExactlyOnce,
        unaligned: true,
        pending_unaligned: Vec::new(),
        unaligned_done: 0,
        control,
        acks: acks_tx.clone(),
        storage: Arc::new(CheckpointStorage::new(dir)),
        writer: Arc::new(InlineWriter(acks_tx)),
        pages: None,
        faults: None,
        clock: Clock::manual(Arc::default()),
        aligner: BarrierAligner::new(channels),
        alignment_timeout_ns: None,
        commits: Arc::default(),
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
    let (mut ahead, r0) = channel::<u64>(16, parker.clone(), parker.clone());
    let (mut behind, r1) = channel::<u64>(16, parker.clone(), parker);
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
