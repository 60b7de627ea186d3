//! Keyed operators: running aggregation (for every input record, update the key's accumulator
//! in [`KeyedValueState`] and emit the result: Flink's keyed `reduce` / `aggregate`), and
//! [`KeyedProcess`], a user function over any [`KeyedState`]. Records reach these operators
//! through a key-by edge, so every key they see belongs to one of their key groups.

use crate::collector::Collector;
use crate::error::Result;
use crate::persist::Persist;
use crate::record::{hash_key, Key, Timestamp};
use crate::state::{HashedEntries, KeyedState, KeyedValueState};

/// How a keyed aggregate reads a record's key: [`ByValue`] (a function that makes the key:
/// `key_by`) or [`ByRef`] (a function that borrows it from the record: `key_by_ref`; the key
/// is copied only when it is new to the state, so an owned `String` key costs no clone a
/// record).
pub(crate) trait RecordKey<T, K>: Send {
    /// What waits beside the key's hash between a block's two passes (the key itself, or
    /// nothing: it is borrowed from the record again).
    type Held: Send;
    fn hold(&self, record: &T) -> (u64, Self::Held);
    fn entry<'m, V>(
        &self,
        state: &'m mut impl HashedEntries<K, V>,
        hash: u64,
        held: Self::Held,
        record: &T,
        init: impl FnOnce() -> V,
    ) -> (&'m K, &'m mut V);
}

/// A key made by a function of the record.
pub(crate) struct ByValue<KF>(pub(crate) KF);

/// A key borrowed from the record (as `Q`) by a function.
pub(crate) struct ByRef<KF, Q: ?Sized>(KF, std::marker::PhantomData<fn(&Q)>);

impl<KF, Q: ?Sized> ByRef<KF, Q> {
    /// The key `key` borrows from a record (the bound gives a closure its higher-ranked type).
    pub(crate) fn new<T>(key: KF) -> Self
    where
        KF: for<'a> Fn(&'a T) -> &'a Q,
    {
        ByRef(key, std::marker::PhantomData)
    }
}

impl<T, K: Key, KF: Fn(&T) -> K + Send> RecordKey<T, K> for ByValue<KF> {
    type Held = K;
    #[inline(always)]
    fn hold(&self, record: &T) -> (u64, K) {
        let k = (self.0)(record);
        (hash_key(&k), k)
    }
    #[inline(always)]
    fn entry<'m, V>(
        &self,
        state: &'m mut impl HashedEntries<K, V>,
        hash: u64,
        held: K,
        _: &T,
        init: impl FnOnce() -> V,
    ) -> (&'m K, &'m mut V) {
        state.entry_hashed(hash, held, init)
    }
}

impl<T, Q, KF> RecordKey<T, Q::Owned> for ByRef<KF, Q>
where
    Q: ?Sized + std::hash::Hash + Eq + ToOwned,
    Q::Owned: Key + std::borrow::Borrow<Q>,
    KF: for<'a> Fn(&'a T) -> &'a Q + Send,
{
    type Held = ();
    #[inline(always)]
    fn hold(&self, record: &T) -> (u64, ()) {
        (hash_key((self.0)(record)), ())
    }
    #[inline(always)]
    fn entry<'m, V>(
        &self,
        state: &'m mut impl HashedEntries<Q::Owned, V>,
        hash: u64,
        _: (),
        record: &T,
        init: impl FnOnce() -> V,
    ) -> (&'m Q::Owned, &'m mut V) {
        state.entry_by_ref_hashed(hash, (self.0)(record), init)
    }
}

pub(crate) struct KeyedAggregate<T, K, A, O, KX: RecordKey<T, K>, I, S> {
    key: KX,
    init: I,
    /// Per record: `step(key, accumulator, record)` folds the record in and makes what is
    /// emitted (it owns the record, so a result may move its fields instead of copying them).
    step: S,
    state: KeyedValueState<K, A>,
    /// The block's key hashes (and keys, by value), between the two passes (kept for its
    /// allocation).
    keys: Vec<(u64, KX::Held)>,
    out: Vec<O>,
    next: Box<dyn Collector<O>>,
    _input: std::marker::PhantomData<fn(T)>,
}

impl<T, K: Key, A: Clone + Persist, O, KX: RecordKey<T, K>, I, S> KeyedAggregate<T, K, A, O, KX, I, S> {
    pub(crate) fn new(key: KX, init: I, step: S, next: Box<dyn Collector<O>>) -> Self {
        KeyedAggregate {
            key,
            init,
            step,
            state: KeyedValueState::new(),
            keys: Vec::new(),
            out: Vec::new(),
            next,
            _input: std::marker::PhantomData,
        }
    }
}

impl<T, K, A, O, KX, I, S> Collector<T> for KeyedAggregate<T, K, A, O, KX, I, S>
where
    K: Key,
    A: Persist + Clone + Send + Sync + 'static,
    O: Send,
    KX: RecordKey<T, K>,
    I: Fn() -> A + Send,
    S: FnMut(&K, &mut A, T) -> O + Send,
{
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        // Large keyed states miss the cache on most lookups: start loading the slots before the
        // updates. Each key is extracted and hashed once: it waits in `keys` from its prefetch
        // to its lookup (for a key that owns memory, a `String` or a long `Word`, extracting it
        // twice was a clone and a drop).
        //
        // Two passes over each block of 32 records (`move_in_blocks`): its keys extracted,
        // hashed and their slots prefetched, then its records folded in (a block's slots stay
        // in L1; a ring of keys a few records ahead cost an `Option` take and put per record;
        // moving them out through iterators of `Option`s stalled word count on its stores).
        //
        // Copy-on-write ownership is checked once for the run when no snapshot shares a page
        // (`owned_pages`), else per write.
        let (key, init, step, out) = (&self.key, &self.init, &mut self.step, &mut self.out);
        out.reserve(records.len());
        if let Some(mut pages) = self.state.owned_pages() {
            fold_run(records, &mut self.keys, &mut pages, key, init, step, out)
        } else if let Some(mut pages) = self.state.owned_pages_tracked() {
            // Changelog checkpoints: each write also marks its slot.
            fold_run(records, &mut self.keys, &mut pages, key, init, step, out)
        } else {
            fold_run(records, &mut self.keys, &mut self.state, key, init, step, out)
        }
        self.next.batch(&mut self.out)
    }
    super::forward_control!(next);
    super::keyed_state_checkpointing!(state);
}

/// Folds a run of records into their keys' accumulators in `state`, emitting each result.
#[inline(always)]
fn fold_run<T, K: Key, A, O, KX: RecordKey<T, K>>(
    records: &mut Vec<T>,
    keys: &mut Vec<(u64, KX::Held)>,
    state: &mut impl HashedEntries<K, A>,
    key: &KX,
    init: &impl Fn() -> A,
    step: &mut impl FnMut(&K, &mut A, T) -> O,
    out: &mut Vec<O>,
) {
    crate::collector::move_in_blocks::<_, _, _, 32>(
        records,
        keys,
        state,
        |state, block, keys| {
            keys.extend(block.iter().map(|r| {
                let (hash, held) = key.hold(r);
                state.prefetch_hashed(hash);
                (hash, held)
            }))
        },
        |state, r, (hash, held)| {
            let (k, acc) = key.entry(state, hash, held, &r, init);
            out.push(step(k, acc, r));
        },
    );
}

/// A user function with keyed state: `f(key, record, state, out)` for every record.
pub(crate) struct KeyedProcess<T, K, S, O, KF, F> {
    key: KF,
    f: F,
    state: S,
    out: Vec<O>,
    next: Box<dyn Collector<O>>,
    _input: std::marker::PhantomData<fn(T, K)>,
}

impl<T, K, S, O, KF, F> KeyedProcess<T, K, S, O, KF, F> {
    pub(crate) fn new(key: KF, state: S, f: F, next: Box<dyn Collector<O>>) -> Self {
        KeyedProcess { key, f, state, out: Vec::new(), next, _input: std::marker::PhantomData }
    }
}

impl<T, K, S, O, KF, F> Collector<T> for KeyedProcess<T, K, S, O, KF, F>
where
    K: Key,
    S: KeyedState,
    O: Send,
    KF: Fn(&T) -> K + Send,
    F: FnMut(&K, T, &mut S, &mut Vec<O>) + Send,
{
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        for r in records.drain(..) {
            let k = (self.key)(&r);
            (self.f)(&k, r, &mut self.state, &mut self.out);
        }
        self.next.batch(&mut self.out)
    }
    super::forward_control!(next);
    super::keyed_state_checkpointing!(state);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    /// The counting step of the `String`-keyed tests: one more for the key, emitted with it.
    #[allow(clippy::ptr_arg)] // a step takes the key as the state stores it
    fn count(k: &String, c: &mut u64, _x: String) -> (String, u64) {
        *c += 1;
        (k.clone(), *c)
    }

    /// What counting `records` after `counts` emits, in order (and `counts` after them).
    fn running_counts(records: &[String], counts: &mut HashMap<String, u64>) -> Vec<(String, u64)> {
        records
            .iter()
            .map(|k| {
                let c = counts.entry(k.clone()).or_insert(0u64);
                *c += 1;
                (k.clone(), *c)
            })
            .collect()
    }

    #[test]
    fn emits_a_running_count_per_key() {
        let rec = Arc::new(Mutex::new(Recorder::<(u8, u64)>::default()));
        let mut op = KeyedAggregate::new(
            ByValue(|x: &u8| *x),
            || 0u64,
            |k: &u8, c: &mut u64, _x: u8| {
                *c += 1;
                (*k, *c)
            },
            Box::new(Arc::clone(&rec)),
        );
        op.batch(&mut vec![1, 2, 1, 1, 2]).unwrap();
        assert_eq!(rec.lock().unwrap().records, vec![(1, 1), (2, 1), (1, 2), (1, 3), (2, 2)]);
    }

    /// A key borrowed from the record (`&str` of a `String`): the same running counts as by
    /// value, over blocks and batches, with a snapshot forked after each batch (so the next run
    /// takes the pages back write by write, then unchecked).
    #[test]
    fn a_key_borrowed_from_the_record_counts_as_one_made_from_it() {
        use crate::state::Snapshot;
        let rec = Arc::new(Mutex::new(Recorder::<(String, u64)>::default()));
        let mut op =
            KeyedAggregate::new(ByRef::new(|x: &String| x.as_str()), || 0u64, count, Box::new(Arc::clone(&rec)));
        let mut expected = Vec::new();
        let mut counts = HashMap::new();
        let mut forks = Vec::new();
        for batch in [0..100u64, 100..101, 101..173, 173..300] {
            let mut records: Vec<String> = batch.map(|i| format!("key-{}", i % 11)).collect();
            expected.extend(running_counts(&records, &mut counts));
            op.batch(&mut records).unwrap();
            forks.push(op.state.fork());
        }
        assert_eq!(rec.lock().unwrap().records, expected);
        assert_eq!(op.state.len(), 11, "each key stored once");
        assert_eq!(op.state.get(&"key-3".to_string()), counts.get("key-3"));
    }

    /// Keys that own memory, over several blocks of the prefetch and a batch that ends mid
    /// block: every record counted once, in order, and the batch vector left empty for reuse.
    #[test]
    fn owned_keys_over_many_blocks_are_counted_in_order() {
        let rec = Arc::new(Mutex::new(Recorder::<(String, u64)>::default()));
        let mut op = KeyedAggregate::new(ByValue(|x: &String| x.clone()), || 0u64, count, Box::new(Arc::clone(&rec)));
        let mut expected = Vec::new();
        let mut counts = HashMap::new();
        for batch in [0..100u64, 100..101, 101..173] {
            let mut records: Vec<String> = batch.map(|i| format!("key-{}", i % 7)).collect();
            expected.extend(running_counts(&records, &mut counts));
            op.batch(&mut records).unwrap();
            assert!(records.is_empty());
        }
        assert_eq!(rec.lock().unwrap().records, expected);
    }
}
