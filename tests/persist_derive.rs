//! `#[derive(weir::Persist)]`: round trips of generated values of every kind of type it takes
//! (named, tuple and unit structs, enums with data, generic types), the evolution rules (a
//! trailing `#[persist(default)]` field restores from older data; every other change is
//! refused with an error naming the type and the field), and a job whose accumulator gained a
//! field restored from a savepoint taken before, next to one whose change is refused.

use std::time::Duration;

use proptest::prelude::*;
use weir::persist::{from_bytes, to_bytes, Persist};

#[derive(Clone, Debug, PartialEq, weir::Persist)]
struct Named {
    id: u64,
    name: String,
    bytes: Vec<u8>,
    boxed: Box<[u8]>,
    maybe: Option<i32>,
    pair: (u8, char),
    grid: [u16; 3],
}

#[derive(Clone, Debug, PartialEq, weir::Persist)]
struct Tuple(u32, String, Vec<Named>);

#[derive(Clone, Debug, PartialEq, weir::Persist)]
struct Unit;

#[derive(Clone, Debug, PartialEq, weir::Persist)]
enum Event {
    Click { user: String, at: u64 },
    Payload(Vec<u8>, Option<Box<Event>>),
    Nested(Tuple),
    Tick,
    Unit(Unit),
}

#[derive(Clone, Debug, PartialEq, weir::Persist)]
struct Generic<A, B> {
    left: A,
    right: Vec<B>,
}

#[derive(Clone, Debug, PartialEq, weir::Persist)]
enum Either<L, R> {
    Left(L),
    Right(R),
}

fn named() -> impl Strategy<Value = Named> {
    (
        any::<u64>(),
        ".{0,40}",
        prop::collection::vec(any::<u8>(), 0..300),
        prop::collection::vec(any::<u8>(), 0..20),
        any::<Option<i32>>(),
        (any::<u8>(), any::<char>()),
        any::<[u16; 3]>(),
    )
        .prop_map(|(id, name, bytes, boxed, maybe, pair, grid)| Named {
            id,
            name,
            bytes,
            boxed: boxed.into_boxed_slice(),
            maybe,
            pair,
            grid,
        })
}

fn tuple() -> impl Strategy<Value = Tuple> {
    (any::<u32>(), ".{0,10}", prop::collection::vec(named(), 0..3)).prop_map(|(a, b, c)| Tuple(a, b, c))
}

fn event() -> impl Strategy<Value = Event> {
    let leaf = prop_oneof![
        (".{0,20}", any::<u64>()).prop_map(|(user, at)| Event::Click { user, at }),
        tuple().prop_map(Event::Nested),
        Just(Event::Tick),
        Just(Event::Unit(Unit)),
    ];
    leaf.prop_recursive(3, 8, 2, |inner| {
        (prop::collection::vec(any::<u8>(), 0..8), prop::option::of(inner))
            .prop_map(|(p, e)| Event::Payload(p, e.map(Box::new)))
    })
}

fn round_trip<T: Persist + PartialEq + std::fmt::Debug>(v: &T) -> Result<(), TestCaseError> {
    let bytes = to_bytes(v);
    prop_assert_eq!(&from_bytes::<T>(&bytes).unwrap(), v);
    // Any cut of the encoding is an error, never a panic or a wrong value.
    for cut in [0, bytes.len() / 2, bytes.len().saturating_sub(1)] {
        if cut < bytes.len() {
            prop_assert!(from_bytes::<T>(&bytes[..cut]).is_err());
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn generated_values_round_trip(n in named(), t in tuple(), e in prop::collection::vec(event(), 0..6),
                                   g in (any::<i64>(), prop::collection::vec(".{0,5}", 0..4)),
                                   either in prop::bool::ANY) {
        round_trip(&n)?;
        round_trip(&t)?;
        round_trip(&e)?;
        round_trip(&Unit)?;
        round_trip(&Generic { left: g.0, right: g.1.clone() })?;
        let v: Either<u8, Generic<String, u64>> =
            if either { Either::Left(7) } else { Either::Right(Generic { left: "x".into(), right: vec![1, 2] }) };
        round_trip(&v)?;
    }
}

mod v1 {
    #[derive(Clone, Debug, Default, PartialEq, weir::Persist)]
    pub(crate) struct Acc {
        pub count: u64,
    }
    #[derive(Clone, Debug, PartialEq, weir::Persist)]
    pub(crate) enum Shape {
        Circle { r: u32 },
        Square(u32),
    }
}

mod v2 {
    #[derive(Clone, Debug, Default, PartialEq, weir::Persist)]
    pub(crate) struct Acc {
        pub count: u64,
        #[persist(default)]
        pub sum: u64,
        #[persist(default)]
        pub label: Option<String>,
    }
    #[derive(Clone, Debug, PartialEq, weir::Persist)]
    pub(crate) enum Shape {
        Circle {
            r: u32,
            #[persist(default)]
            filled: bool,
        },
        Square(u32),
        Triangle(u32, u32, u32),
    }
    /// `sum` added without `#[persist(default)]`: old data cannot fill it.
    #[derive(Clone, Debug, Default, PartialEq, weir::Persist)]
    pub(crate) struct Strict {
        pub count: u64,
        pub sum: u64,
    }
    /// `count` retyped.
    #[derive(Clone, Debug, PartialEq, weir::Persist)]
    pub(crate) struct Retyped {
        pub count: u32,
    }
}

#[test]
fn a_trailing_default_field_restores_from_older_data_even_inside_collections() {
    let old = vec![(1u64, v1::Acc { count: 3 }), (2, v1::Acc { count: 5 })];
    let new: Vec<(u64, v2::Acc)> = from_bytes(&to_bytes(&old)).unwrap();
    assert_eq!(
        new,
        vec![(1, v2::Acc { count: 3, sum: 0, label: None }), (2, v2::Acc { count: 5, sum: 0, label: None })]
    );
    let shapes = vec![v1::Shape::Circle { r: 2 }, v1::Shape::Square(4)];
    let new: Vec<v2::Shape> = from_bytes(&to_bytes(&shapes)).unwrap();
    assert_eq!(new, vec![v2::Shape::Circle { r: 2, filled: false }, v2::Shape::Square(4)]);
}

#[test]
fn every_other_change_is_refused_naming_the_type_and_the_field() {
    let old = to_bytes(&v1::Acc { count: 3 });
    let err = from_bytes::<v2::Strict>(&old).unwrap_err().to_string();
    assert!(err.contains("field `sum` of Strict") && err.contains("#[persist(default)]"), "{err}");
    let err = from_bytes::<v2::Retyped>(&old).unwrap_err().to_string();
    assert!(err.contains("Retyped") && err.contains("left after its last field"), "{err}");
    // Newer data (more fields, more variants) into the older type.
    let newer = to_bytes(&v2::Acc { count: 1, sum: 2, label: Some("x".into()) });
    let err = from_bytes::<v1::Acc>(&newer).unwrap_err().to_string();
    assert!(err.contains("Acc") && err.contains("more fields"), "{err}");
    let err = from_bytes::<v1::Shape>(&to_bytes(&v2::Shape::Triangle(1, 2, 3))).unwrap_err().to_string();
    assert!(err.contains("Shape has no variant number 2"), "{err}");
}

/// A job keeping a per-key accumulator (named `acc`) fed by the host; returns its savepoint
/// after `events` events, or the job's error when it cannot start.
mod evolving_job {
    use super::*;
    use weir::checkpoint::CheckpointConfig;
    use weir::sink::RecvError;
    use weir::{Job, RunConfig};

    pub(crate) fn run<A, F, R>(
        dir: &std::path::Path,
        from: Option<&std::path::Path>,
        events: std::ops::Range<u64>,
        fold: F,
        report: R,
    ) -> weir::Result<(std::path::PathBuf, Vec<(u64, u64)>)>
    where
        A: Persist + Clone + Default + Send + Sync + 'static,
        F: Fn(&mut A, u64) + Clone + Send + 'static,
        R: Fn(&A) -> u64 + Clone + Send + 'static,
    {
        let mut job =
            Job::new("evolving").with_checkpointing(CheckpointConfig::new(dir).interval(Duration::from_secs(3600)));
        if let Some(savepoint) = from {
            job = job.restore_from(savepoint, false);
        }
        let (mut tx, stream) = job.push_source::<u64>(1024);
        let mut rx = stream
            .named("events")
            .key_by(|e: &u64| e % 3)
            .aggregate(A::default, fold, move |k: &u64, a: &A| (*k, report(a)))
            .named("acc")
            .pull_sink(1024);
        let handle = job.start(RunConfig::default().workers(2))?;
        let resume = tx.resume_from(Duration::from_secs(120)).map_err(|e| weir::Error::config(e.to_string()));
        let resume = match resume {
            Ok(r) => r,
            Err(e) => {
                drop(tx);
                return Err(handle.join().err().unwrap_or(e));
            }
        };
        assert_eq!(resume, events.start, "the restored job resumes after the savepoint's events");
        let wanted = events.end - events.start;
        for e in events {
            tx.send_timeout(e, Duration::from_secs(120)).unwrap();
        }
        let mut got = Vec::new();
        while (got.len() as u64) < wanted {
            match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(d) => got.push(d.record),
                Err(RecvError::Timeout) => panic!("no result in two minutes"),
                Err(e) => return Err(weir::Error::config(e.to_string())),
            }
        }
        let stopped = handle.stop_with_savepoint(dir.join("savepoints"))?;
        drop(tx);
        Ok((stopped.savepoint().expect("a savepoint was taken"), got))
    }
}

#[test]
fn an_accumulator_that_gained_a_default_field_restores_from_an_older_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let (savepoint, first) = evolving_job::run::<v1::Acc, _, _>(
        &dir.path().join("a"),
        None,
        0..30,
        |a: &mut v1::Acc, _| a.count += 1,
        |a: &v1::Acc| a.count,
    )
    .unwrap();
    assert_eq!(first.iter().filter(|(k, _)| *k == 0).map(|(_, c)| *c).max(), Some(10));
    // v2 restores v1's counts and starts its sums at the default.
    let (_, second) = evolving_job::run::<v2::Acc, _, _>(
        &dir.path().join("b"),
        Some(&savepoint),
        30..33,
        |a: &mut v2::Acc, e| {
            a.count += 1;
            a.sum += e;
        },
        |a: &v2::Acc| a.count * 1000 + a.sum,
    )
    .unwrap();
    let mut second = second;
    second.sort();
    assert_eq!(second, vec![(0, 11_030), (1, 11_031), (2, 11_032)], "counts continue from the savepoint");

    // A change the rules refuse: the job does not start, and says which job, operator and field.
    let err = evolving_job::run::<v2::Strict, _, _>(
        &dir.path().join("c"),
        Some(&savepoint),
        30..31,
        |a: &mut v2::Strict, _| a.count += 1,
        |a: &v2::Strict| a.count,
    )
    .unwrap_err();
    assert!(matches!(err, weir::Error::IncompatibleState { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("'evolving'") && msg.contains("'acc'") && msg.contains("field `sum` of Strict"), "{msg}");
}
