//! End-to-end pipelines at parallelism 1, 2 and 4 on 2 workers, each compared with a plain
//! sequential computation of the same result.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use weir::prng::mix;
use weir::source::{Generator, TextSource};
use weir::{Error, Job, RunConfig, Window, WindowBounds};
use weir_jobs::wordcount::wordcount;

const PARALLELISMS: [usize; 3] = [1, 2, 4];

fn config() -> RunConfig {
    RunConfig::default().workers(2)
}

fn write_corpus(dir: &Path) {
    let vocabulary = [
        "Stream",
        "stream",
        "WEIR",
        "river",
        "dam",
        "über",
        "Straße",
        "naïve",
        "日本語",
        "x1",
        "42",
        "barrier",
        "checkpoint",
        "ÉCLAIR",
    ];
    let long = "supercalifragilisticexpialidocious".repeat(2);
    for f in 0..3u64 {
        let mut text = String::new();
        for line in 0..1500u64 {
            let n = mix(f * 10_000 + line) % 9;
            for w in 0..n {
                let r = mix(f * 1_000_000 + line * 100 + w);
                if r.is_multiple_of(97) {
                    text.push_str(&long);
                } else {
                    text.push_str(vocabulary[(r % vocabulary.len() as u64) as usize]);
                }
                text.push_str(["  ", ", ", "-", "'", "\t", "—"][(r >> 20) as usize % 6]);
            }
            text.push_str(if line % 7 == 0 { "\r\n" } else { "\n" });
        }
        std::fs::write(dir.join(format!("part{f}.txt")), text).unwrap();
    }
    // An empty file and invalid UTF-8 are inputs too.
    std::fs::write(dir.join("part3.txt"), "").unwrap();
    std::fs::write(dir.join("part4.txt"), b"ok \xff\xfe broken\nstream\n").unwrap();
}

fn sequential_word_counts(dir: &Path) -> HashMap<String, u64> {
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut counts = HashMap::new();
    for f in files {
        let text = String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned();
        for w in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
            *counts.entry(w.to_lowercase()).or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn word_count_gives_every_running_count_once() {
    let input = tempfile::tempdir().unwrap();
    write_corpus(input.path());
    let expected = sequential_word_counts(input.path());
    for p in PARALLELISMS {
        let out = tempfile::tempdir().unwrap();
        let job = wordcount(TextSource::open(input.path()).unwrap(), out.path().to_path_buf(), p, false);
        let report = job.execute(config()).unwrap();
        let mut got: HashMap<String, Vec<u64>> = HashMap::new();
        for f in std::fs::read_dir(out.path()).unwrap() {
            let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
            for line in text.lines() {
                let (w, c) = line.split_once('\t').expect("word<TAB>count");
                got.entry(w.to_string()).or_default().push(c.parse().unwrap());
            }
        }
        assert_eq!(got.len(), expected.len(), "parallelism {p}: distinct words");
        for (w, n) in &expected {
            let mut counts = got.remove(w).unwrap_or_else(|| panic!("parallelism {p}: {w:?} missing"));
            counts.sort_unstable();
            assert_eq!(counts, (1..=*n).collect::<Vec<_>>(), "parallelism {p}: counts of {w:?}");
        }
        assert_eq!(report.sink_records, expected.values().sum::<u64>());
    }
}

/// Event `i`: key, and a timestamp up to `DISORDER - 1` away from `i` (out of order, bounded).
const DISORDER: u64 = 50;
fn event(i: u64) -> (u64, u64, u64) {
    (mix(i) % 13, i + mix(i ^ 0xABCD) % DISORDER, i)
}

#[test]
fn windows_over_out_of_order_events_match_a_sequential_computation() {
    const N: u64 = 60_000;
    for window in [Window::tumbling(1000), Window::sliding(1000, 250)] {
        // Sequential: every (key, window start) → (count, sum of ids).
        let mut expected: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
        for i in 0..N {
            let (k, ts, id) = event(i);
            let mut start = ts - ts % window.slide;
            loop {
                let e = expected.entry((k, start)).or_default();
                e.0 += 1;
                e.1 += id;
                if start < window.slide || start - window.slide + window.size <= ts {
                    break;
                }
                start -= window.slide;
            }
        }
        for p in PARALLELISMS {
            let job = Job::new("windows").with_parallelism(p);
            let results = job
                .generator(Generator::new(|i, _| event(i)).count(N))
                .with_watermarks(|e: &(u64, u64, u64)| e.1, DISORDER)
                .key_by(|e: &(u64, u64, u64)| e.0)
                .window(window, |e: &(u64, u64, u64)| e.1)
                .aggregate(
                    || (0u64, 0u64),
                    |a: &mut (u64, u64), e: (u64, u64, u64)| {
                        a.0 += 1;
                        a.1 += e.2;
                    },
                    |&k, w: WindowBounds, &(c, s)| (k, w.start, c, s),
                )
                .collect();
            let report = job.execute(config()).unwrap();
            assert_eq!(report.late_records, 0, "bounded disorder within the bound is never late");
            let got: BTreeMap<(u64, u64), (u64, u64)> =
                results.lock().unwrap().iter().map(|&(k, s, c, sum)| ((k, s), (c, sum))).collect();
            assert_eq!(results.lock().unwrap().len(), got.len(), "a window fired twice");
            assert_eq!(got, expected, "window {window:?} at parallelism {p}");
        }
    }
}

#[test]
fn window_join_matches_a_sequential_join() {
    const N: u64 = 4_000;
    let left = |i: u64| (mix(i) % 50, i * 3, i);
    let right = |i: u64| (mix(i + 7) % 50, i * 2, i);
    let size = 500;
    let mut expected = Vec::new();
    for l in (0..N).map(left) {
        for r in (0..N).map(right) {
            if l.0 == r.0 && l.1 / size == r.1 / size {
                expected.push((l.0, l.2, r.2));
            }
        }
    }
    expected.sort_unstable();
    assert!(expected.len() > 1000, "the join should produce something");
    for p in PARALLELISMS {
        let job = Job::new("join").with_parallelism(p);
        let l =
            job.generator(Generator::new(move |i, _| left(i)).count(N)).with_watermarks(|e: &(u64, u64, u64)| e.1, 0);
        let r =
            job.generator(Generator::new(move |i, _| right(i)).count(N)).with_watermarks(|e: &(u64, u64, u64)| e.1, 0);
        let out = l
            .window_join(
                r,
                |e: &(u64, u64, u64)| e.0,
                |e: &(u64, u64, u64)| e.0,
                |e: &(u64, u64, u64)| e.1,
                |e: &(u64, u64, u64)| e.1,
                Window::tumbling(size),
                |&k, a: &(u64, u64, u64), b: &(u64, u64, u64)| (k, a.2, b.2),
            )
            .collect();
        job.execute(config()).unwrap();
        let mut got = out.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(got, expected, "parallelism {p}");
    }
}

#[test]
fn keyed_sum_union_rebalance_and_broadcast() {
    const N: u64 = 50_000;
    for p in PARALLELISMS {
        let job = Job::new("keyed").with_parallelism(p);
        let a = job.generator(Generator::new(|i, _| i).count(N));
        let b = job.generator(Generator::new(|i, _| i + N).count(N));
        let sums = a
            .union(b)
            .map(|x| (x % 100, x))
            .filter(|&(_, x)| x % 3 != 0)
            .key_by(|&(k, _)| k)
            .reduce(|a, b| (a.0, a.1 + b.1))
            .collect();
        let spread = job.generator(Generator::new(|i, _| i).count(1000)).rebalance().set_parallelism(3).collect();
        let everywhere = job.generator(Generator::new(|i, _| i).count(100)).broadcast().set_parallelism(3).collect();
        job.execute(config()).unwrap();
        // The last running value per key is the key's total.
        let mut last: HashMap<u64, u64> = HashMap::new();
        let mut seen = 0;
        for &(k, s) in sums.lock().unwrap().iter() {
            let e = last.entry(k).or_insert(0);
            assert!(s >= *e, "running sums only grow");
            *e = s;
            seen += 1;
        }
        let mut expected: HashMap<u64, u64> = HashMap::new();
        for x in (0..2 * N).filter(|x| x % 3 != 0) {
            *expected.entry(x % 100).or_insert(0) += x;
        }
        assert_eq!(last, expected, "parallelism {p}");
        assert_eq!(seen, (0..2 * N).filter(|x| x % 3 != 0).count());
        let mut s = spread.lock().unwrap().clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(everywhere.lock().unwrap().len(), 300, "each of 3 subtasks gets all 100");
    }
}

#[test]
fn tiny_rings_and_a_slow_sink_backpressure_without_loss() {
    let job = Job::new("backpressure").with_parallelism(2);
    let out = job
        .generator(Generator::new(|i, _| i).count(20_000))
        .key_by(|x: &u64| x % 7)
        .reduce(|a, b| a + b)
        .map(|x| {
            if x % 1000 == 0 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            x
        })
        .collect();
    job.execute(config().ring_capacity(1).batch_size(3)).unwrap();
    assert_eq!(out.lock().unwrap().len(), 20_000);
}

#[test]
fn a_panicking_function_fails_the_job_naming_operator_and_subtask() {
    let job = Job::new("panics").with_parallelism(2);
    job.generator(Generator::new(|i, _| i).count(100_000))
        .map(|x| {
            assert!(x != 5_001, "bad record {x}");
            x
        })
        .named("fragile")
        .discard();
    let err = job.execute(config()).unwrap_err();
    match err {
        Error::OperatorPanicked { operator, subtask, message } => {
            assert_eq!(operator, "fragile");
            assert_eq!(subtask, 1, "record 5001 is generated by subtask 1 of 2");
            assert!(message.contains("bad record 5001"), "{message}");
        }
        other => panic!("expected a panic error, got {other}"),
    }
}

#[test]
fn cancel_and_stop_from_the_api() {
    let job = Job::new("forever").with_parallelism(2);
    job.generator(Generator::new(|i, _| i)).discard();
    let handle = job.start(config()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    handle.cancel();
    assert!(matches!(handle.join(), Err(Error::Cancelled)));

    let job = Job::new("stoppable").with_parallelism(2);
    let counts = job
        .generator(Generator::new(|i, _| (i % 5, i)))
        .with_watermarks(|e: &(u64, u64)| e.1, 0)
        .key_by(|e: &(u64, u64)| e.0)
        .window(Window::tumbling(1_000_000), |e: &(u64, u64)| e.1)
        .count()
        .collect();
    let handle = job.start(config()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    handle.stop();
    let report = handle.join().unwrap();
    // Stopping ends the streams: the open windows fire, and every record emitted is counted.
    let total: u64 = counts.lock().unwrap().iter().map(|c| c.2).sum();
    assert_eq!(total, report.source_records);
    assert!(total > 0);
}

#[test]
fn push_source_and_pull_sink_embed_a_job() {
    let job = Job::new("embedded");
    let (mut tx, events) = job.push_source::<u64>(1024);
    let mut rx = events.map(|x| x * 10).pull_sink(1024);
    let handle = job.start(config()).unwrap();
    let mut received = Vec::new();
    for i in 0..10_000u64 {
        let mut e = i;
        while let Err(back) = tx.try_send(e) {
            assert!(matches!(back, weir::source::SendError::Full(_)), "{back}");
            e = back.into_event();
            while let Ok(r) = rx.try_recv() {
                received.push(r);
            }
        }
    }
    tx.close();
    // The sink's stream ends: the receiver knows it has everything before the job is joined.
    loop {
        match rx.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(r) => received.push(r),
            Err(weir::sink::RecvError::Ended { error: None }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    handle.join().unwrap();
    assert_eq!(
        received.iter().map(|d| d.record).collect::<Vec<_>>(),
        (0..10_000u64).map(|x| x * 10).collect::<Vec<_>>()
    );
    assert!(received.iter().enumerate().all(|(i, d)| d.seq == i as u64), "numbered in order");
}

#[test]
fn invalid_graphs_and_settings_are_clear_errors() {
    let job = Job::new("bad");
    job.generator(Generator::new(|i, _| i).count(10))
        .key_by(|x: &u64| *x)
        .reduce(|a, b| a + b)
        .set_parallelism(500)
        .discard();
    let err = job.execute(config()).unwrap_err().to_string();
    assert!(err.contains("max parallelism"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a b\n").unwrap();
    let job = Job::new("lines");
    job.text(TextSource::open(dir.path()).unwrap()).words().set_parallelism(3).discard();
    let err = job.execute(config()).unwrap_err().to_string();
    assert!(err.contains("must keep the parallelism"), "{err}");

    let job = Job::new("cap");
    job.generator(Generator::new(|i, _| i).count(10)).discard();
    let err = job.execute(config().ring_capacity(0)).unwrap_err().to_string();
    assert!(err.contains("ring capacity"), "{err}");

    let job = Job::new("window");
    job.generator(Generator::new(|i, _| i).count(10))
        .key_by(|x: &u64| *x)
        .window(Window::sliding(10, 20), |x: &u64| *x)
        .count()
        .discard();
    let err = job.execute(config()).unwrap_err().to_string();
    assert!(err.contains("slide"), "{err}");
}

/// A job, its handle and the host's endpoints move to other threads (a tokio blocking task,
/// say); the handle's read-only methods work through `&self` from any thread.
#[test]
fn jobs_handles_and_endpoints_are_send_and_the_handle_is_sync() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Job>();
    send::<weir::JobHandle>();
    sync::<weir::JobHandle>();
    send::<weir::source::EventSender<String>>();
    send::<weir::sink::EventReceiver<String>>();

    let job = Job::new("moved");
    let (mut tx, events) = job.push_source::<String>(64);
    let mut rx = events.map(|s: String| s.len() as u64).pull_sink(64);
    // Built on one thread, started and joined on another.
    let handle = std::thread::spawn(move || job.start(config()).unwrap()).join().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = (handle.metrics().source_records(), handle.checkpoint_stats(), handle.notes());
        });
    });
    tx.send_timeout("four".to_string(), std::time::Duration::from_secs(120)).unwrap();
    assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(120)).unwrap().record, 4);
    drop(tx);
    let report = std::thread::spawn(move || handle.join()).join().unwrap().unwrap();
    assert_eq!(report.source_records, 1);
}

/// A second operator given a name the job already has was renamed silently (`count-3`), and
/// its state and metrics went under a name nobody gave; Flink refuses a duplicate `uid`. The
/// start is refused, naming it; one operator named twice is only renamed.
#[test]
fn a_duplicate_operator_name_is_refused() {
    let job = Job::new("duplicate-names");
    let numbers = job.generator(Generator::new(|i, _| i).count(10)).named("numbers").named("source");
    let doubled = numbers.map(|x: u64| x * 2).named("count");
    doubled.map(|x: u64| x + 1).named("count").discard();
    let err = job.start(config()).map(|h| h.join()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("two operators are named 'count'"), "{err}");

    let job = Job::new("renamed");
    job.generator(Generator::new(|i, _| i).count(10)).named("numbers").named("source").discard();
    job.start(config()).unwrap().join().unwrap();
}
