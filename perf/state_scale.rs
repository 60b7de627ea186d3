//! Incremental checkpoints against the size of the state, with uniform updates: keyed state of
//! 64 MiB to `--max-gib` GiB (u64 keys, 48-byte values: 64-byte slots, three quarters full),
//! one full checkpoint, then `--updates` updates to keys drawn uniformly between checkpoints
//! (a running count over many keys: every page is touched, few of its keys). Per size: the
//! checkpoint's duration (the synchronous fork and the background write) and bytes written,
//! median of `--rounds`, beside the bytes of the entries that changed: incremental checkpoints
//! (every page written since the last one is written again) and changelog checkpoints (the
//! written slots only; the first round is a base too, as writes are tracked from the fork
//! after the first changelog checkpoint, so take at least 3 rounds), on the same state and
//! updates, one after the other. A changelog chain is due for a new base every
//! `--materialize-every` checkpoints (default 4): it is materialized on a thread of its own
//! while the updates go on, as the runtime does it, and the longest checkpoint of the rounds
//! after the first shows whether any checkpoint waited for a base.
//!
//! `cargo bench --bench state_scale -- [--max-gib G] [--updates N] [--rounds N] [--materialize-every N] [--each]`
//! (`--each`: every checkpoint's duration, in order)

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weir::checkpoint::{materialize, write_task_snapshot, CheckpointStorage, PageIndex};
use weir::metrics::group_digits;
use weir::snapshot::{Barrier, CheckpointNotice, TaskSnapshot};
use weir::state::{KeyedValueState, Snapshot};

type Wide = [u64; 6];

/// What one checkpoint took and wrote.
struct Taken {
    fork_s: f64,
    write_s: f64,
    written: u64,
    /// A base due: the maps and their fork, to materialize from.
    due: Option<(Vec<u64>, weir::snapshot::SharedFork)>,
}

/// Checkpoint `id` of `state` into `storage`.
fn checkpoint(
    storage: &CheckpointStorage,
    index: &PageIndex,
    id: u64,
    state: &mut KeyedValueState<u64, Wide>,
) -> Taken {
    storage.prepare(id).expect("checkpoint folder");
    let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
    let t = Instant::now();
    snap.add("state".into(), 0, state.fork());
    let fork_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let w = write_task_snapshot(storage, Some(index), 0, &snap).expect("checkpoint written");
    let write_s = t.elapsed().as_secs_f64();
    index.on_notice(CheckpointNotice::Complete(id));
    // Bounds the disk used (the writes measured read nothing back).
    if id > 2 {
        storage.discard(id - 2);
    }
    let due = (!w.materialize.is_empty())
        .then(|| (w.materialize, Arc::new(Mutex::new(snap.parts.pop().expect("one part").state))));
    Taken { fork_s, write_s, written: w.written_bytes, due }
}

/// A round's total, fork and write seconds, bytes written, and the changed entries' bytes.
type Round = (f64, f64, f64, u64, u64);

/// One checkpoint per round after `updates` uniform updates of `state`'s `keys` keys, each
/// changelog base materialized on a thread of its own meanwhile: the rounds, and the bases
/// materialized.
fn run_rounds(
    storage: &CheckpointStorage,
    index: &PageIndex,
    state: &mut KeyedValueState<u64, Wide>,
    keys: u64,
    (updates, rounds): (u64, usize),
) -> (Vec<Round>, usize) {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut runs = Vec::new();
    let mut materialized = 0;
    std::thread::scope(|scope| {
        for round in 0..rounds {
            let mut changed = HashSet::new();
            for _ in 0..updates {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = x % keys;
                state.get_or_insert_with(k, || [0; 6])[0] += 1;
                changed.insert(k);
            }
            let id = 2 + round as u64;
            let t = checkpoint(storage, index, id, state);
            // A changelog entry: the key, the value and a key group (u16) — the least it holds.
            runs.push((t.fork_s + t.write_s, t.fork_s, t.write_s, t.written, changed.len() as u64 * (8 + 48 + 2)));
            // Materialized on a thread of its own while the updates go on.
            if let Some((maps, fork)) = t.due {
                materialized += 1;
                scope.spawn(move || {
                    materialize(storage, index, 0, id, &[fork], &maps, &|| false).expect("base materialized");
                });
            }
        }
    });
    (runs, materialized)
}

fn main() {
    let (max_gib, updates, rounds): (f64, f64, usize) =
        (common::flag("--max-gib", 1.0), common::flag("--updates", 1e6), common::flag("--rounds", 3));
    let every: u32 = common::flag("--materialize-every", 4);
    let updates = updates as u64;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "incremental checkpoints after {} uniform updates; load average before: {}",
        group_digits(updates),
        load.trim()
    );
    println!(
        "| state | checkpoints | keys | pages touched | changed entries' bytes | fork ms | write ms | checkpoint ms | longest ms | bytes written | bases materialized |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let scratch = tempfile::tempdir_in(common::target_dir()).expect("scratch");
    let mut mib = 64.0;
    while mib <= max_gib * 1024.0 {
        let slots = ((mib * (1u64 << 20) as f64) as u64 / 64).next_power_of_two();
        let keys = slots / 2 + slots / 4;
        let mut state: KeyedValueState<u64, Wide> = KeyedValueState::new();
        for k in 0..keys {
            state.put(k, [k; 6]);
        }
        for kind in ["incremental", "changelog"] {
            let storage = CheckpointStorage::new(scratch.path().join(format!("{mib}-{kind}")));
            let index = if kind == "changelog" { PageIndex::changelog(every) } else { PageIndex::default() };
            checkpoint(&storage, &index, 1, &mut state);
            let (mut runs, materialized) = run_rounds(&storage, &index, &mut state, keys, (updates, rounds));
            if std::env::args().any(|a| a == "--each") {
                let each: Vec<String> = runs.iter().map(|r| format!("{:.0}", r.0 * 1e3)).collect();
                println!("{mib} MiB {kind}, each checkpoint's ms: {}", each.join(" "));
            }
            // The first round writes a base (writes are tracked from its fork on).
            let longest = runs.iter().skip(1).map(|r| r.0).fold(0.0, f64::max);
            runs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (_, fork_s, write_s, written, entry_bytes) = runs[runs.len() / 2];
            // A page holds a page's share of the keys: untouched by `updates` uniform ones with
            // probability exp(-updates / pages).
            let pages = (slots / weir::state::PAGE_SLOTS as u64) as f64;
            println!(
                "| {} MiB | {kind} | {} | ~{:.0}% | {} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {materialized} |",
                mib,
                group_digits(keys),
                100.0 * (1.0 - (-(updates as f64) / pages).exp()),
                group_digits(entry_bytes),
                fork_s * 1e3,
                write_s * 1e3,
                (fork_s + write_s) * 1e3,
                longest * 1e3,
                group_digits(written)
            );
            let _ = std::fs::remove_dir_all(scratch.path().join(format!("{mib}-{kind}")));
        }
        drop(state);
        mib *= 4.0;
    }
}
