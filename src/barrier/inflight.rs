//! How a task names and encodes the in-flight data it captured for an unaligned checkpoint:
//! one part per input, named by [`crate::snapshot::PartName::Inflight`] (a typed name, never
//! split from a string by hand), holding `(channel, entries)` per channel; and how a restore
//! at another parallelism re-routes it ([`rescale_inflight`]), each edge by its own rule.
//!
//! May touch: `channel`, `error`, `persist`, `snapshot`; in tests `prng` and `record`.

use std::collections::BTreeMap;

use crate::channel::{Captured, Entry, KeyRouter};
use crate::error::Result;
use crate::persist::Persist;
use crate::snapshot::PartName;

/// The name under which a task stores the in-flight data of its input `input`.
pub(crate) fn inflight_part(operator: &str, input: usize) -> String {
    PartName::Inflight { operator: operator.to_string(), input }.to_string()
}

/// Encodes one gate's captured in-flight data as `Vec<(u64, Vec<Entry<T>>)>` encodes (what
/// [`decode_inflight`] reads): the entries were encoded as they were captured, so only the
/// counts are written here.
pub(crate) fn encode_inflight(data: Vec<(usize, Captured)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + data.iter().map(|(_, c)| 16 + c.bytes.len()).sum::<usize>());
    (data.len() as u64).persist(&mut out);
    for (channel, captured) in data {
        (channel as u64).persist(&mut out);
        captured.entries.persist(&mut out);
        out.extend_from_slice(&captured.bytes);
    }
    out
}

/// Decodes in-flight data written by [`encode_inflight`].
pub(crate) fn decode_inflight<T: Persist>(bytes: &[u8]) -> Result<ChannelEntries<T>> {
    let data: Vec<(u64, Vec<Entry<T>>)> = crate::persist::from_bytes(bytes)?;
    Ok(data.into_iter().map(|(c, e)| (c as usize, e)).collect())
}

/// How an edge spread records over its downstream subtasks: the rule by which a restore at
/// another parallelism re-routes the edge's in-flight records.
pub(crate) enum InflightRoute<T> {
    /// Subtask i's channel from upstream i: each old subtask's in-flight data goes, whole, to
    /// new subtask `i % parallelism` (a forward edge's consumer holds no keyed state).
    Forward,
    /// Whole batches round-robin: as forward, but every channel comes from every upstream
    /// subtask.
    Rebalance,
    /// Each record to the subtask owning its key group: every old subtask's in-flight records
    /// are routed again by key, so each lands where its key's state was restored.
    KeyBy {
        /// The edge's key hash.
        hash: Box<dyn Fn(&T) -> u64 + Send>,
        /// The job's key groups.
        max_parallelism: usize,
    },
    /// Every record to every subtask: each new subtask replays the in-flight data of the old
    /// subtask whose broadcast state it restored.
    Broadcast,
}

/// One input's in-flight data: `(channel, entries)` per channel.
pub(crate) type ChannelEntries<T> = Vec<(usize, Vec<Entry<T>>)>;

/// The in-flight data new subtask `subtask` of `parallelism` replays on one input of
/// `channels` channels, from every old subtask's `(old subtask, (channel, entries) per
/// channel)`. `broadcast_from` is the old subtask whose broadcast state it restored.
///
/// Records go where the edge's rule sends them (see [`InflightRoute`]), old channel `c`
/// replayed on channel `c % channels` in old subtask order, so a key's records keep their
/// order (they came through one channel of one old subtask). Watermarks are dropped: a channel's
/// watermark was its old upstream subtask's, and the new upstream on that channel may be
/// behind it (its event time restored as the least of the old subtasks'), so replaying it could
/// make the new upstream's records late. Event time resumes with the next watermark from
/// upstream; no record is late that was not. Barriers of old checkpoints are dropped too, and
/// an end of stream (the new upstream on the channel ends it).
pub(crate) fn rescale_inflight<T>(
    route: &InflightRoute<T>,
    old: Vec<(usize, ChannelEntries<T>)>,
    subtask: usize,
    parallelism: usize,
    channels: usize,
    broadcast_from: usize,
) -> ChannelEntries<T> {
    assert!(subtask < parallelism && channels > 0, "subtask {subtask} of {parallelism}, {channels} channels");
    // A key-by edge's records go to the subtask that owns their key group now.
    let keyed = match route {
        InflightRoute::KeyBy { hash, max_parallelism } => Some((hash, KeyRouter::new(*max_parallelism, parallelism))),
        _ => None,
    };
    let mut by_channel: BTreeMap<usize, Vec<Entry<T>>> = BTreeMap::new();
    for (old_subtask, per_channel) in old {
        let replayed_here = match route {
            InflightRoute::Forward | InflightRoute::Rebalance => old_subtask % parallelism == subtask,
            InflightRoute::Broadcast => old_subtask == broadcast_from,
            // Record by record, below.
            InflightRoute::KeyBy { .. } => true,
        };
        if !replayed_here {
            continue;
        }
        for (channel, entries) in per_channel {
            let records = entries.into_iter().filter(|e| match e {
                Entry::Record(r) => keyed.as_ref().is_none_or(|(hash, router)| router.subtask(hash(r)) == subtask),
                // The new upstream on the channel ends it itself.
                Entry::Watermark(_) | Entry::Barrier(_) | Entry::End => false,
            });
            by_channel.entry(channel % channels).or_default().extend(records);
        }
    }
    by_channel.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The captured encoding is the one `decode_inflight` reads, for records that own memory.
    #[test]
    fn captured_entries_decode_as_written() {
        let entries = [Entry::Record("a".to_string()), Entry::Watermark(4), Entry::Record("βγ".repeat(9))];
        let mut captured = Captured::default();
        for e in &entries {
            e.persist(&mut captured.bytes);
            captured.entries += 1;
        }
        let bytes = encode_inflight(vec![(3, captured), (5, Captured::default())]);
        let back = decode_inflight::<String>(&bytes).unwrap();
        assert_eq!(back, vec![(3, entries.to_vec()), (5, Vec::new())]);
    }

    fn keyed(max_parallelism: usize) -> InflightRoute<u64> {
        InflightRoute::KeyBy { hash: Box::new(|r: &u64| crate::record::hash_key(&(r / 1000))), max_parallelism }
    }

    fn records(entries: &[Entry<u64>]) -> Vec<u64> {
        entries.iter().filter_map(|e| if let Entry::Record(r) = e { Some(*r) } else { None }).collect()
    }

    /// The watermarks of old upstreams are not replayed (the new upstream on a channel may be
    /// behind them); records are, in their order, and so are old barriers not.
    #[test]
    fn a_rescaled_channel_replays_its_records_without_old_watermarks() {
        use Entry::{Barrier as B, Record as R, Watermark as W};
        let barrier = crate::snapshot::Barrier { id: 3, trigger_ns: 0, unaligned: true, savepoint: false };
        let old = vec![
            (0, vec![(0, vec![R(1), W(10), R(2), B(barrier), W(20), R(3)]), (1, vec![R(7)])]),
            (1, vec![(0, vec![R(4), W(20), R(5)])]),
        ];
        let got = rescale_inflight(
            &InflightRoute::KeyBy { hash: Box::new(|_: &u64| 0), max_parallelism: 128 },
            old,
            0,
            1,
            1,
            0,
        );
        assert_eq!(got, vec![(0, vec![R(1), R(2), R(3), R(7), R(4), R(5)])]);
    }

    /// Forward and rebalance data go whole to subtask `i % p`; broadcast data comes from the
    /// subtask whose broadcast state was restored.
    #[test]
    fn pointwise_and_broadcast_edges_follow_their_own_rules() {
        use Entry::Record as R;
        let old = || (0..3).map(|i| (i, vec![(0, vec![R(i as u64)])])).collect::<Vec<_>>();
        let forward = |s| rescale_inflight(&InflightRoute::Forward, old(), s, 2, 1, 0);
        assert_eq!(forward(0), vec![(0, vec![R(0), R(2)])]);
        assert_eq!(forward(1), vec![(0, vec![R(1)])]);
        let rebalance = rescale_inflight(&InflightRoute::Rebalance, old(), 0, 2, 1, 0);
        assert_eq!(rebalance, vec![(0, vec![R(0), R(2)])]);
        let broadcast = rescale_inflight(&InflightRoute::Broadcast, old(), 1, 2, 1, 2);
        assert_eq!(broadcast, vec![(0, vec![R(2)])]);
    }

    /// Random in-flight data of a keyed edge re-routed from 3 subtasks to 1, 2, 4 and 5, with
    /// the upstream at 3 and at fewer channels: every record reaches exactly the subtask that
    /// owns its key, in the order its old subtask held it.
    #[test]
    fn keyed_in_flight_data_lands_once_where_its_key_is() {
        let mut rng = crate::prng::Prng::new(7);
        let (upstream, old_p) = (3usize, 3usize);
        for round in 0..40 {
            // Old subtask s holds from upstream u records (u * 10 + s) * 100_000 + n, increasing
            // (key record / 1000), and watermarks between them.
            let old: Vec<(usize, ChannelEntries<u64>)> = (0..old_p)
                .map(|s| {
                    let per_channel = (0..upstream)
                        .map(|u| {
                            let n = rng.below(40);
                            let mut entries: Vec<Entry<u64>> =
                                (0..n).map(|n| Entry::Record((u as u64 * 10 + s as u64) * 100_000 + n)).collect();
                            for _ in 0..rng.below(4) {
                                entries.insert(rng.below(entries.len() as u64 + 1) as usize, Entry::Watermark(n));
                            }
                            (u, entries)
                        })
                        .collect();
                    (s, per_channel)
                })
                .collect();
            let mut all: Vec<u64> = old.iter().flat_map(|(_, pc)| pc.iter().flat_map(|(_, e)| records(e))).collect();
            for p in [1, 2, 4, 5] {
                let channels = 1 + round % upstream;
                let route = keyed(16);
                let router = KeyRouter::new(16, p);
                let mut seen = Vec::new();
                for s in 0..p {
                    for (channel, entries) in rescale_inflight(&route, old.clone(), s, p, channels, 0) {
                        assert!(channel < channels);
                        assert!(entries.iter().all(|e| matches!(e, Entry::Record(_))), "only records are replayed");
                        let got = records(&entries);
                        for r in &got {
                            assert_eq!(router.subtask(crate::record::hash_key(&(r / 1000))), s, "record {r}");
                        }
                        for copy in got.iter().map(|r| r / 100_000) {
                            let of_copy: Vec<u64> = got.iter().copied().filter(|r| r / 100_000 == copy).collect();
                            assert!(of_copy.windows(2).all(|w| w[0] < w[1]), "copy {copy} reordered: {of_copy:?}");
                        }
                        seen.extend(got);
                    }
                }
                all.sort_unstable();
                seen.sort_unstable();
                assert_eq!(seen, all, "every record exactly once at parallelism {p}");
            }
        }
    }
}
