//! Keyed state, and the snapshot interface every stateful operator implements.
//!
//! A snapshot is two steps, as DESIGN.md section 4 requires: a synchronous [`Snapshot::fork`]
//! taken while the task is paused at a barrier, and an asynchronous [`ForkedState::write_to`]
//! run in the background while the task goes on. Today's [`KeyedValueState`] forks by copying
//! its map; the arena backend (a later issue) forks by sharing pages copy-on-write behind the
//! same two calls, so operators need not change.
//!
//! May touch: `record`, `error`.

use std::io::{self, Read, Write};

use bytemuck::Pod;

use crate::record::{Key, KeyMap};

/// State that can be snapshotted in two steps.
pub trait Snapshot {
    /// The synchronous part: capture the current state so later writes do not affect it.
    fn fork(&mut self) -> Box<dyn ForkedState>;
    /// Replaces the state with what [`ForkedState::write_to`] wrote.
    fn restore(&mut self, from: &mut dyn Read) -> io::Result<()>;
}

/// A captured state, written out in the background.
pub trait ForkedState: Send {
    /// Writes the captured state; returns the bytes written.
    fn write_to(&self, out: &mut dyn Write) -> io::Result<u64>;
}

/// One value per key (Flink's `ValueState`), local to a subtask.
///
/// ```
/// use weir::state::KeyedValueState;
/// let mut counts: KeyedValueState<u64, u64> = KeyedValueState::new();
/// *counts.get_or_insert_with(7, || 0) += 1;
/// assert_eq!(counts.get(&7), Some(&1));
/// ```
pub struct KeyedValueState<K, V> {
    map: KeyMap<K, V>,
}

impl<K: Key, V> Default for KeyedValueState<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key, V> KeyedValueState<K, V> {
    /// Empty state.
    pub fn new() -> Self {
        KeyedValueState {
            map: KeyMap::default(),
        }
    }
    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }
    /// The value of `key`, inserting `init()` first if there is none.
    #[inline]
    pub fn get_or_insert_with(&mut self, key: K, init: impl FnOnce() -> V) -> &mut V {
        self.map.entry(key).or_insert_with(init)
    }
    /// Sets the value of `key`.
    #[inline]
    pub fn put(&mut self, key: K, value: V) {
        self.map.insert(key, value);
    }
    /// Removes `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.map.remove(key)
    }
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Whether no key has a value.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// All entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter()
    }
}

struct CopiedEntries<K, V> {
    entries: Vec<(K, V)>,
}

impl<K: Pod + Send, V: Pod + Send> ForkedState for CopiedEntries<K, V> {
    fn write_to(&self, out: &mut dyn Write) -> io::Result<u64> {
        out.write_all(&(self.entries.len() as u64).to_le_bytes())?;
        let mut n = 8;
        for (k, v) in &self.entries {
            out.write_all(bytemuck::bytes_of(k))?;
            out.write_all(bytemuck::bytes_of(v))?;
            n += (std::mem::size_of::<K>() + std::mem::size_of::<V>()) as u64;
        }
        Ok(n)
    }
}

impl<K: Key + Pod, V: Pod + Send> Snapshot for KeyedValueState<K, V> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(CopiedEntries {
            entries: self.map.iter().map(|(k, v)| (*k, *v)).collect(),
        })
    }

    fn restore(&mut self, from: &mut dyn Read) -> io::Result<()> {
        let mut len = [0u8; 8];
        from.read_exact(&mut len)?;
        let len = u64::from_le_bytes(len);
        let mut map = KeyMap::default();
        for _ in 0..len {
            let mut k = K::zeroed();
            let mut v = V::zeroed();
            from.read_exact(bytemuck::bytes_of_mut(&mut k))?;
            from.read_exact(bytemuck::bytes_of_mut(&mut v))?;
            map.insert(k, v);
        }
        self.map = map;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_is_isolated_from_later_writes_and_restores() {
        let mut s: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..100 {
            s.put(k, k * 10);
        }
        let fork = s.fork();
        for k in 0..100 {
            *s.get_or_insert_with(k, || 0) += 1;
        }
        s.put(1000, 1);
        let mut bytes = Vec::new();
        let n = fork.write_to(&mut bytes).unwrap();
        assert_eq!(n as usize, bytes.len());
        let mut r: KeyedValueState<u64, u64> = KeyedValueState::new();
        r.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(r.len(), 100);
        for k in 0..100 {
            assert_eq!(r.get(&k), Some(&(k * 10)));
        }
        assert_eq!(s.get(&5), Some(&51));
        assert!(
            r.restore(&mut &bytes[..10]).is_err(),
            "a truncated snapshot must not restore"
        );
    }
}
