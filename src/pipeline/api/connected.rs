//! [`ConnectedStreams`] and [`BroadcastConnectedStream`]: two inputs into one keyed process
//! function.
//!
//! May touch: `channel`, `operator`, `record`.

use crate::channel::Partitioning;
use crate::operator::co_process::{
    BroadcastProcessOperator, CoProcessOperator, KeyedBroadcastProcessFunction, KeyedCoProcessFunction,
};
use crate::pipeline::graph::channels_of;
use crate::record::{Key, Record};

use super::*;

impl<A: Record, B: Record, K: Key, KA, KB> ConnectedStreams<A, B, KA, KB>
where
    KA: Fn(&A) -> K + Clone + Send + 'static,
    KB: Fn(&B) -> K + Clone + Send + 'static,
{
    /// Runs `f` over both streams (see [`KeyedCoProcessFunction`]); its state and timers are
    /// checkpointed, restored and rescaled by key group like a one-input process function's.
    pub fn process<P>(self, f: P) -> Stream<P::Out>
    where
        P: KeyedCoProcessFunction<K, A, B> + Clone,
        P::Out: Record,
    {
        let ConnectedStreams { first, second } = self;
        let inputs = [(Partitioning::KeyBy, first.keyed_channels()), (Partitioning::KeyBy, second.keyed_channels())];
        let (k1, k2) = (first.key.clone(), second.key.clone());
        first.stream.two_input("co-process", &second.stream, inputs, move |ctx, outputs| {
            Ok(Box::new(CoProcessOperator::new(ctx, k1.clone(), k2.clone(), f.clone(), outputs)?))
        })
    }
}

impl<T: Record, B: Record, K: Key, KF: Fn(&T) -> K + Clone + Send + 'static> BroadcastConnectedStream<T, B, KF> {
    /// Runs `f` over the keyed stream and the broadcast one (see
    /// [`KeyedBroadcastProcessFunction`]). Every subtask's broadcast state is in its snapshot;
    /// a rescaled restore gives every new subtask the same one.
    pub fn process<P>(self, f: P) -> Stream<P::Out>
    where
        P: KeyedBroadcastProcessFunction<K, T, B> + Clone,
        P::Out: Record,
    {
        let BroadcastConnectedStream { keyed, broadcast } = self;
        let inputs = [
            (Partitioning::KeyBy, keyed.keyed_channels()),
            (Partitioning::Broadcast, channels_of::<B, fn(&B) -> u64>(None)),
        ];
        let key = keyed.key.clone();
        keyed.stream.two_input("broadcast-process", &broadcast, inputs, move |ctx, outputs| {
            Ok(Box::new(BroadcastProcessOperator::new(ctx, key.clone(), f.clone(), outputs)?))
        })
    }
}
