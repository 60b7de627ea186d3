//! map, filter, flat_map and pass-through: no state, no timers.

use super::Emitter;
use crate::collector::Collector;
use crate::error::Result;
use crate::record::Timestamp;

pub(crate) struct Map<F, U> {
    f: F,
    out: Vec<U>,
    next: Box<dyn Collector<U>>,
}

impl<F, U> Map<F, U> {
    pub(crate) fn new(f: F, next: Box<dyn Collector<U>>) -> Self {
        Map { f, out: Vec::new(), next }
    }
}

impl<T, U: Send, F: FnMut(T) -> U + Send> Collector<T> for Map<F, U> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.out.extend(records.drain(..).map(&mut self.f));
        self.next.batch(&mut self.out)
    }
    forward_control!(next);
}

pub(crate) struct Filter<F, T> {
    f: F,
    next: Box<dyn Collector<T>>,
}

impl<F, T> Filter<F, T> {
    pub(crate) fn new(f: F, next: Box<dyn Collector<T>>) -> Self {
        Filter { f, next }
    }
}

impl<T: Send, F: FnMut(&T) -> bool + Send> Collector<T> for Filter<F, T> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        records.retain(&mut self.f);
        if records.is_empty() {
            return Ok(());
        }
        self.next.batch(records)
    }
    forward_control!(next);
}

pub(crate) struct FlatMap<F, U> {
    f: F,
    out: Vec<U>,
    next: Box<dyn Collector<U>>,
}

impl<F, U> FlatMap<F, U> {
    pub(crate) fn new(f: F, next: Box<dyn Collector<U>>) -> Self {
        FlatMap { f, out: Vec::new(), next }
    }
}

impl<T, U: Send, F: FnMut(T, &mut Emitter<'_, U>) + Send> Collector<T> for FlatMap<F, U> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let mut em = Emitter { out: &mut self.out };
        for r in records.drain(..) {
            (self.f)(r, &mut em);
        }
        if self.out.is_empty() {
            return Ok(());
        }
        self.next.batch(&mut self.out)
    }
    forward_control!(next);
}

/// Forwards everything (the operator behind `union`, whose inputs merge in its input gate).
pub(crate) struct PassThrough<T> {
    next: Box<dyn Collector<T>>,
}

impl<T> PassThrough<T> {
    pub(crate) fn new(next: Box<dyn Collector<T>>) -> Self {
        PassThrough { next }
    }
}

impl<T: Send> Collector<T> for PassThrough<T> {
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.next.batch(records)
    }
    forward_control!(next);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::sync::{Arc, Mutex};

    #[test]
    fn map_filter_flat_map_chain() {
        let rec = Arc::new(Mutex::new(Recorder::<u64>::default()));
        let fm = FlatMap::new(
            |x: u64, e: &mut Emitter<'_, u64>| {
                e.emit(x);
                e.emit(x + 100);
            },
            Box::new(Arc::clone(&rec)),
        );
        let filter = Filter::new(|x: &u64| x.is_multiple_of(2), Box::new(fm));
        let mut map = Map::new(|x: u64| x * 3, Box::new(filter));
        map.batch(&mut vec![1, 2, 3, 4]).unwrap();
        map.watermark(5).unwrap();
        map.end().unwrap();
        let r = rec.lock().unwrap();
        assert_eq!(r.records, vec![6, 106, 12, 112]);
        assert_eq!(r.watermarks, vec![5]);
        assert!(r.ended);
    }
}
