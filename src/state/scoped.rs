//! Keyed state seen through the current key: what a keyed process function's context hands
//! out ([`ScopedState::scoped`]), as Flink scopes `ValueState` and the rest to the key of the
//! record (or timer) being processed. A view borrows the state and the key, so no call can
//! reach another key's entry. Also [`ReducingState`] (Flink's `ReducingState`).
//!
//! May touch: `error`, `persist`, `record`, `snapshot`, `state::kinds`, `state::paged`.

use super::kinds::{AggregatingState, KeyedState, ListState, MapState};
use super::{KeyedValueState, Snapshot};
use crate::error::Result;
use crate::persist::Persist;
use crate::record::{Key, KeyScope};
use crate::snapshot::{ForkedState, PersistedFork};

/// Keyed state that can be seen through one key: the state of a
/// [`crate::operator::process::KeyedProcessFunction`]. Implemented by every built-in kind, by
/// pairs of them (`(ValueState, ListState)` gives a pair of views), and by `()` (no state).
pub trait ScopedState<K>: KeyedState {
    /// The state seen through one key.
    type View<'a>
    where
        Self: 'a,
        K: 'a;
    /// The view of `key`'s entries.
    fn scoped<'a>(&'a mut self, key: &'a K) -> Self::View<'a>;
    /// The time now, for state that expires ([`super::TtlValueState`]): processing time in
    /// milliseconds and the operator's watermark. Called before every record and timer.
    fn advance_time(&mut self, _processing_ms: crate::record::Timestamp, _watermark: Option<crate::record::Timestamp>) {
    }
}

/// One key's value in a [`KeyedValueState`].
pub struct ValueView<'a, K, V> {
    state: &'a mut KeyedValueState<K, V>,
    key: &'a K,
}

impl<K: Key, V: Clone + Persist> ValueView<'_, K, V> {
    /// The value, if there is one.
    pub fn get(&self) -> Option<&V> {
        self.state.get(self.key)
    }
    /// Sets the value.
    pub fn set(&mut self, value: V) {
        self.state.put(self.key.clone(), value)
    }
    /// The value, made by `init` first if there is none.
    pub fn get_or_insert_with(&mut self, init: impl FnOnce() -> V) -> &mut V {
        self.state.get_or_insert_with(self.key.clone(), init)
    }
    /// Removes the value, returning it.
    pub fn clear(&mut self) -> Option<V> {
        self.state.remove(self.key)
    }
}

impl<K: Key, V: Persist + Clone + Send + Sync + 'static> ScopedState<K> for KeyedValueState<K, V> {
    type View<'a>
        = ValueView<'a, K, V>
    where
        K: 'a,
        V: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> ValueView<'a, K, V> {
        ValueView { state: self, key }
    }
}

/// One key's list in a [`ListState`].
pub struct ListView<'a, K, T> {
    state: &'a mut ListState<K, T>,
    key: &'a K,
}

impl<K: Key, T: Clone + Persist> ListView<'_, K, T> {
    /// Appends `value`.
    pub fn add(&mut self, value: T) {
        self.state.add(self.key.clone(), value)
    }
    /// The list (empty if none).
    pub fn get(&self) -> &[T] {
        self.state.get(self.key)
    }
    /// Replaces the list (an empty one removes it).
    pub fn update(&mut self, values: Vec<T>) {
        self.state.update(self.key.clone(), values)
    }
    /// Removes the list, returning it.
    pub fn take(&mut self) -> Vec<T> {
        self.state.take(self.key)
    }
}

impl<K: Key, T: Persist + Clone + Send + Sync + 'static> ScopedState<K> for ListState<K, T> {
    type View<'a>
        = ListView<'a, K, T>
    where
        K: 'a,
        T: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> ListView<'a, K, T> {
        ListView { state: self, key }
    }
}

/// One key's map in a [`MapState`].
pub struct MapView<'a, K, UK, UV> {
    state: &'a mut MapState<K, UK, UV>,
    key: &'a K,
}

impl<K: Key, UK: Key, UV: Clone + Persist> MapView<'_, K, UK, UV> {
    /// Sets entry `user_key`.
    pub fn put(&mut self, user_key: UK, value: UV) {
        self.state.put(self.key.clone(), user_key, value)
    }
    /// Entry `user_key`.
    pub fn get(&self, user_key: &UK) -> Option<&UV> {
        self.state.get(self.key, user_key)
    }
    /// Whether there is an entry `user_key`.
    pub fn contains(&self, user_key: &UK) -> bool {
        self.state.contains(self.key, user_key)
    }
    /// Removes entry `user_key`.
    pub fn remove(&mut self, user_key: &UK) -> Option<UV> {
        self.state.remove(self.key, user_key)
    }
    /// The entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&UK, &UV)> {
        self.state.iter(self.key)
    }
    /// The user keys, in no particular order.
    pub fn keys(&self) -> &[UK] {
        self.state.user_keys(self.key)
    }
    /// Whether the map has no entries.
    pub fn is_empty(&self) -> bool {
        self.keys().is_empty()
    }
}

impl<K: Key, UK: Key, UV: Persist + Clone + Send + Sync + 'static> ScopedState<K> for MapState<K, UK, UV> {
    type View<'a>
        = MapView<'a, K, UK, UV>
    where
        K: 'a,
        UK: 'a,
        UV: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> MapView<'a, K, UK, UV> {
        MapView { state: self, key }
    }
}

/// One key's accumulator in an [`AggregatingState`].
pub struct AggregatingView<'a, K, T, A> {
    state: &'a mut AggregatingState<K, T, A>,
    key: &'a K,
}

impl<K: Key, T, A: Clone + Persist> AggregatingView<'_, K, T, A> {
    /// Folds `input` in; returns the accumulator.
    pub fn add(&mut self, input: T) -> &A {
        self.state.add(self.key.clone(), input)
    }
    /// The accumulator, if any input was added.
    pub fn get(&self) -> Option<&A> {
        self.state.get(self.key)
    }
    /// Forgets the accumulator, returning it.
    pub fn clear(&mut self) -> Option<A> {
        self.state.clear(self.key)
    }
}

impl<K: Key, T: 'static, A: Persist + Clone + Send + Sync + 'static> ScopedState<K> for AggregatingState<K, T, A> {
    type View<'a>
        = AggregatingView<'a, K, T, A>
    where
        K: 'a,
        T: 'a,
        A: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> AggregatingView<'a, K, T, A> {
        AggregatingView { state: self, key }
    }
}

/// One value per key combined with each input by the state's own function (Flink's
/// `ReducingState`): the first input is the value; each later one is `reduce(value, input)`.
///
/// ```
/// use weir::state::ReducingState;
/// let mut max: ReducingState<u64, u64> = ReducingState::new(|a, b| *a.max(b));
/// max.add(1, 5);
/// max.add(1, 3);
/// assert_eq!(max.get(&1), Some(&5));
/// ```
pub struct ReducingState<K, T> {
    values: KeyedValueState<K, T>,
    reduce: fn(&T, &T) -> T,
}

impl<K: Key, T: Clone + Persist> ReducingState<K, T> {
    /// Empty state combining values with `reduce`.
    pub fn new(reduce: fn(&T, &T) -> T) -> Self {
        ReducingState { values: KeyedValueState::new(), reduce }
    }
    /// Combines `input` into `key`'s value; returns it.
    pub fn add(&mut self, key: K, input: T) -> &T {
        let reduce = self.reduce;
        let mut input = Some(input);
        let v = self.values.get_or_insert_with(key, || input.take().expect("once"));
        if let Some(input) = input {
            *v = reduce(v, &input);
        }
        v
    }
    /// `key`'s value.
    pub fn get(&self, key: &K) -> Option<&T> {
        self.values.get(key)
    }
    /// Forgets `key`'s value.
    pub fn clear(&mut self, key: &K) -> Option<T> {
        self.values.remove(key)
    }
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.values.len()
    }
    /// Whether no key has a value.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl<K: Key, T: Persist + Clone + Send + Sync + 'static> Snapshot for ReducingState<K, T> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        self.values.fork()
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.values.restore(bytes)
    }
}

impl<K: Key, T: Persist + Clone + Send + Sync + 'static> KeyedState for ReducingState<K, T> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        KeyedValueState::restore_owned(&mut self.values, parts.iter().copied(), scope)
    }
}

/// One key's value in a [`ReducingState`].
pub struct ReducingView<'a, K, T> {
    state: &'a mut ReducingState<K, T>,
    key: &'a K,
}

impl<K: Key, T: Clone + Persist> ReducingView<'_, K, T> {
    /// Combines `input` in; returns the value.
    pub fn add(&mut self, input: T) -> &T {
        self.state.add(self.key.clone(), input)
    }
    /// The value, if any input was added.
    pub fn get(&self) -> Option<&T> {
        self.state.get(self.key)
    }
    /// Forgets the value, returning it.
    pub fn clear(&mut self) -> Option<T> {
        self.state.clear(self.key)
    }
}

impl<K: Key, T: Persist + Clone + Send + Sync + 'static> ScopedState<K> for ReducingState<K, T> {
    type View<'a>
        = ReducingView<'a, K, T>
    where
        K: 'a,
        T: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> ReducingView<'a, K, T> {
        ReducingView { state: self, key }
    }
}

/// No state: a process function that only uses timers (or nothing).
impl Snapshot for () {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(PersistedFork(()))
    }
    fn restore(&mut self, _bytes: &[u8]) -> Result<()> {
        Ok(())
    }
}

impl KeyedState for () {
    fn restore_owned(&mut self, _parts: &[&[u8]], _scope: &KeyScope) -> Result<()> {
        Ok(())
    }
}

impl<K> ScopedState<K> for () {
    type View<'a>
        = ()
    where
        K: 'a;
    fn scoped<'a>(&'a mut self, _key: &'a K) {}
}

/// Two kinds of state, seen as a pair of views.
impl<K, A: ScopedState<K>, B: ScopedState<K>> ScopedState<K> for (A, B) {
    type View<'a>
        = (A::View<'a>, B::View<'a>)
    where
        Self: 'a,
        K: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> Self::View<'a> {
        (self.0.scoped(key), self.1.scoped(key))
    }
    fn advance_time(&mut self, processing_ms: crate::record::Timestamp, watermark: Option<crate::record::Timestamp>) {
        self.0.advance_time(processing_ms, watermark);
        self.1.advance_time(processing_ms, watermark);
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!(['a, K, V] ValueView<'a, K, V>);
crate::debug_as_name!(['a, K, T] ListView<'a, K, T>);
crate::debug_as_name!(['a, K, UK, UV] MapView<'a, K, UK, UV>);
crate::debug_as_name!(['a, K, T, A] AggregatingView<'a, K, T, A>);
crate::debug_as_name!([K, T] ReducingState<K, T>);
crate::debug_as_name!(['a, K, T] ReducingView<'a, K, T>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_reach_only_their_key() {
        type Three = (KeyedValueState<u8, u64>, (ListState<u8, u32>, ReducingState<u8, u64>));
        let mut s: Three = (KeyedValueState::new(), (ListState::new(), ReducingState::new(|a, b| a + b)));
        for key in [1u8, 2] {
            let (mut value, (mut list, mut sum)) = s.scoped(&key);
            value.set(key as u64 * 10);
            list.add(key as u32);
            list.add(7);
            sum.add(5);
            assert_eq!(*sum.add(key as u64), 5 + key as u64);
        }
        let (value, (mut list, sum)) = s.scoped(&1);
        assert_eq!(value.get(), Some(&10));
        assert_eq!(list.take(), vec![1, 7]);
        assert_eq!(sum.get(), Some(&6));
        assert_eq!(s.1 .0.get(&2), &[2, 7], "key 2's list is untouched");
        assert!(s.1 .0.get(&1).is_empty());
    }
}
