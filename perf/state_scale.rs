//! Incremental checkpoints against the size of the state, with uniform updates: keyed state of
//! 64 MiB to `--max-gib` GiB (u64 keys, 48-byte values: 64-byte slots, three quarters full),
//! one full checkpoint, then `--updates` updates to keys drawn uniformly between checkpoints
//! (a running count over many keys: every page is touched, few of its keys). Per size: the
//! checkpoint's duration (the synchronous fork and the background write) and bytes written,
//! median of `--rounds`, beside the bytes of the entries that changed: incremental checkpoints
//! (every page written since the last one is written again) and changelog checkpoints (the
//! written slots only; the first round is a base too, as writes are tracked from the fork
//! after the first changelog checkpoint, so take at least 3 rounds; a new base every tenth),
//! on the same state and updates, one after the other.
//!
//! `cargo bench --bench state_scale -- [--max-gib G] [--updates N] [--rounds N]`

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod common;

use std::collections::HashSet;
use std::time::Instant;

use weir::checkpoint::{write_task_snapshot, CheckpointStorage, PageIndex};
use weir::metrics::group_digits;
use weir::snapshot::{Barrier, CheckpointNotice, TaskSnapshot};
use weir::state::{KeyedValueState, Snapshot};

type Wide = [u64; 6];

/// Checkpoint `id` of `state` into `storage`: seconds for the fork and for the write, and the
/// bytes written.
fn checkpoint(
    storage: &CheckpointStorage,
    index: &PageIndex,
    id: u64,
    state: &mut KeyedValueState<u64, Wide>,
) -> (f64, f64, u64) {
    storage.prepare(id).expect("checkpoint folder");
    let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
    let t = Instant::now();
    snap.add("state".into(), 0, state.fork());
    let fork_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let w = write_task_snapshot(storage, Some(index), 0, &snap).expect("checkpoint written");
    let write_s = t.elapsed().as_secs_f64();
    index.on_notice(CheckpointNotice::Complete(id));
    if id > 2 {
        storage.discard(id - 2);
    }
    (fork_s, write_s, w.written_bytes)
}

fn main() {
    let (max_gib, updates, rounds): (f64, f64, usize) =
        (common::flag("--max-gib", 1.0), common::flag("--updates", 1e6), common::flag("--rounds", 3));
    let updates = updates as u64;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "incremental checkpoints after {} uniform updates; load average before: {}",
        group_digits(updates),
        load.trim()
    );
    println!(
        "| state | checkpoints | keys | pages touched | changed entries' bytes | fork ms | write ms | checkpoint ms | bytes written |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
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
            let index = if kind == "changelog" { PageIndex::changelog(10) } else { PageIndex::default() };
            checkpoint(&storage, &index, 1, &mut state);
            let mut x = 0x2545_F491_4F6C_DD1Du64;
            let mut runs = Vec::new();
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
                let (fork_s, write_s, written) = checkpoint(&storage, &index, 2 + round as u64, &mut state);
                // A changelog entry: the key, the value and a key group (u16) — the least it holds.
                runs.push((fork_s + write_s, fork_s, write_s, written, changed.len() as u64 * (8 + 48 + 2)));
            }
            runs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (_, fork_s, write_s, written, entry_bytes) = runs[runs.len() / 2];
            // A page holds a page's share of the keys: untouched by `updates` uniform ones with
            // probability exp(-updates / pages).
            let pages = (slots / weir::state::PAGE_SLOTS as u64) as f64;
            println!(
                "| {} MiB | {kind} | {} | ~{:.0}% | {} | {:.1} | {:.0} | {:.0} | {} |",
                mib,
                group_digits(keys),
                100.0 * (1.0 - (-(updates as f64) / pages).exp()),
                group_digits(entry_bytes),
                fork_s * 1e3,
                write_s * 1e3,
                (fork_s + write_s) * 1e3,
                group_digits(written)
            );
            let _ = std::fs::remove_dir_all(scratch.path().join(format!("{mib}-{kind}")));
        }
        drop(state);
        mib *= 4.0;
    }
}
