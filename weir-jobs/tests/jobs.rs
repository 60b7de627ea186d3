//! The jobs of `weir-jobs` (the command's jobs): Nexmark against its sequential reference, the
//! benchmark workloads under every checkpoint mode, word count's output format and the
//! benchmarks' Zipf keys. Here, not as unit tests of that crate, so the crate is compiled once for the test suite.

mod nexmark {
    use weir::runtime::RunConfig;
    use weir::Job;
    use weir_jobs::nexmark::*;

    #[test]
    fn the_generator_keeps_the_standard_proportions_and_hot_ids() {
        let n = 50_000;
        let events: Vec<Event> = (0..n).map(event).collect();
        let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count() as u64;
        assert_eq!(count(|e| matches!(e, Event::Person(_))), n / 50);
        assert_eq!(count(|e| matches!(e, Event::Auction(_))), n / 50 * 3);
        let bids: Vec<&Bid> = events.iter().filter_map(bid_of).collect();
        let hot = bids.iter().filter(|b| (b.auction - FIRST_AUCTION_ID).is_multiple_of(HOT_ID_STEP)).count();
        assert!(hot * 2 > bids.len() * 9 / 20, "about half the bids go to hot auctions ({hot} of {})", bids.len());
        assert!(bids.iter().all(|b| (100..=100_000_000).contains(&b.price)));
        assert_eq!(event(12_345), event(12_345), "an event depends only on its number");
        // Bids refer to auctions and people that already exist.
        for (n, e) in events.iter().enumerate() {
            if let Event::Bid(b) = e {
                assert!(b.auction < FIRST_AUCTION_ID + auctions_before(n as u64));
                assert!(b.bidder < FIRST_PERSON_ID + people_before(n as u64));
            }
        }
    }

    #[test]
    fn prices_are_ten_to_a_uniform_power_within_a_cent() {
        let exact = |r: u64| {
            let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
            10f64.powf(unit * 6.0) * 100.0
        };
        for r in (0..200_000u64).map(weir::prng::mix).chain([0, u64::MAX, 1 << 11, u64::MAX - (1 << 11)]) {
            let (got, want) = (price(r) as f64, exact(r));
            assert!((got - want).abs() <= 1.0, "price({r:#x}) = {got}, 10^(6u)·100 = {want}");
        }
        assert_eq!(price(0), 100, "the lowest price is a dollar");
    }

    /// Every query at parallelism 1, 2 and 4 gives what the sequential implementation gives.
    #[test]
    fn every_query_matches_the_sequential_implementation() {
        let events = 60_000;
        for (q, p) in Query::ALL.into_iter().flat_map(|q| [1, 2, 4].map(|p| (q, p))) {
            let job = Job::new(format!("nexmark-{q}")).with_parallelism(p);
            let out = build(&job, q, Some(events), None).collect();
            job.execute(RunConfig::default().workers(2)).unwrap();
            let got = final_rows(q, out.lock().unwrap().clone());
            let expected = reference(q, events);
            assert!(!expected.is_empty(), "{q}");
            assert_eq!(got.len(), expected.len(), "{q} at {p}: row count");
            assert!(got == expected, "{q} at {p}: rows differ");
        }
    }
}

mod wordcount {
    use weir::Word;
    use weir_jobs::wordcount::*;

    #[test]
    fn decimals() {
        let mut v = Vec::new();
        let mut cases = vec![0u64, 7, 12345, u64::MAX];
        for p in 0..20 {
            let ten = 10u64.pow(p);
            cases.extend([ten - 1, ten, ten + 1, ten.saturating_mul(7) / 3]);
        }
        for n in cases {
            v.clear();
            v.extend_from_slice(b"x");
            push_decimal(&mut v, n);
            assert_eq!(String::from_utf8(v.clone()).unwrap(), format!("x{n}"));
        }
    }

    #[test]
    fn count_lines() {
        let mut out = b"earlier\n".to_vec();
        let mut expected = String::from("earlier\n");
        let long = "w".repeat(weir::record::WORD_INLINE_BYTES + 5);
        let longest_inline = "x".repeat(weir::record::WORD_INLINE_BYTES);
        for (text, c) in [("a", 1u64), ("zz", 99), (&longest_inline, u64::MAX), (&long, 12345)] {
            format_count(&(Word::new(text), c), &mut out);
            expected.push_str(&format!("{text}\t{c}\n"));
        }
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    /// Word count's `source_records` counted the blocks its text source hands over (113
    /// beside 100,000 lines): it counts the lines they hold, a last one without its newline
    /// included.
    #[test]
    fn source_records_are_the_input_lines() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.txt");
        let mut text: String = (0..100_000).map(|i| format!("line {i} of words\n")).collect();
        text.push_str("and a last one without its newline");
        std::fs::write(&input, text).unwrap();
        let source = weir::source::TextSource::open(&input).unwrap();
        let job = wordcount(source, dir.path().join("out"), 2, false);
        let report = job.start(weir::RunConfig::default().workers(2)).unwrap().join().unwrap();
        assert_eq!(report.source_records, 100_001);
        assert_eq!(report.sink_records, 400_007, "four words a line, seven in the last");
    }

    #[test]
    fn keys_stay_in_range_and_all_are_used() {
        let mut seen = vec![false; 1000];
        for i in 0..100_000 {
            seen[key_of(i, 1000) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}

mod bench {
    use std::time::Duration;

    use weir::checkpoint::{CheckpointConfig, CheckpointMode, ModeKeys, ModeKind};
    use weir::runtime::RunConfig;
    use weir_jobs::bench::*;

    #[test]
    fn names_parse_back() {
        for w in Workload::ALL {
            assert_eq!(w.to_string().parse::<Workload>(), Ok(w));
        }
        assert!("fast".parse::<Workload>().unwrap_err().contains("stateless"));
    }

    /// Every workload runs under every checkpoint mode (and none) and reports what the JSON
    /// needs.
    #[test]
    fn every_workload_runs_and_reports() {
        let dir = tempfile::tempdir().unwrap();
        let choices: Vec<Option<ModeKind>> = [None].into_iter().chain(ModeKind::ALL.map(Some)).collect();
        for (i, workload) in Workload::ALL.into_iter().enumerate() {
            let kind = choices[i % choices.len()];
            // Under what the smallest job's rings hold.
            let keys = |k| ModeKeys::word(k, Duration::from_millis(2), 64 << 10);
            let checkpoint = kind.map(|k| {
                CheckpointConfig::new(dir.path().join(workload.to_string()))
                    .interval(Duration::from_millis(20))
                    .mode(CheckpointMode::from_flat(keys(k)).unwrap())
            });
            let config = BenchConfig {
                workload,
                checkpoint,
                parallelism: 2,
                rate: Some(200_000.0),
                keys: 100,
                zipf: None,
                sink_cost_ns: 1_000,
            };
            let checkpoint = kind.map_or("none", ModeKind::name);
            let handle = config.job().unwrap().start(RunConfig::default().workers(2)).unwrap();
            // Runs until what the report is checked for has happened: records at the sink, and
            // a completed checkpoint when it takes them.
            crate::common::wait_until(&format!("{workload} {checkpoint} to report"), || {
                handle.metrics().sink_records() > 0 && (kind.is_none() || !handle.checkpoint_stats().is_empty())
            });
            handle.stop();
            let report = handle.join().unwrap();
            let result = BenchResult::new(&config, &report);
            assert!(result.records > 0, "{workload}");
            let json: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
            for field in ["workload", "checkpoint", "parallelism", "workers", "duration_s", "records", "throughput_rps"]
            {
                assert!(!json[field].is_null(), "{workload}: {field}");
            }
            if workload != Workload::Join && workload != Workload::Window {
                assert!(json["latency_ns"]["p99"].as_u64().is_some(), "{workload}: latency");
            }
            assert_eq!(json["checkpoint"], checkpoint, "{workload}");
            if kind.is_some() {
                assert!(!result.checkpoints.is_empty(), "{workload} {checkpoint}: no checkpoint completed");
                assert!(json["checkpoints"][0]["incremental_bytes"].is_u64());
            }
        }
    }

    /// The checkpoint lab at a short interval went AAUUUAUAUUUUU…: it picked the mode once per
    /// supervise tick by the completed count, so two checkpoints in one tick (or one triggered
    /// before the tick saw the last complete) repeated a mode. The coordinator now takes the
    /// next mode as it triggers each checkpoint: consecutive checkpoints alternate.
    #[test]
    fn the_checkpoint_lab_takes_turns_checkpoint_by_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let config = BenchConfig {
            workload: Workload::Backpressure,
            // Far shorter than the runner's supervise tick (100 ms).
            checkpoint: Some(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(5))),
            parallelism: 2,
            rate: None,
            keys: 100,
            zipf: None,
            sink_cost_ns: 1_000,
        };
        let handle = config.job().unwrap().start(RunConfig::default().workers(2)).unwrap();
        // What weir-ops' checkpoint lab hands the coordinator.
        handle
            .checkpoints_in_turn(|c| vec![c.clone().mode(CheckpointMode::Aligned), c.mode(CheckpointMode::Unaligned)])
            .unwrap();
        crate::common::wait_until("twelve checkpoints", || handle.checkpoints_completed() >= 12);
        handle.stop();
        let report = handle.join().unwrap();
        let stats: Vec<_> = report.checkpoints.iter().filter(|s| s.mode.is_some()).collect();
        // Consecutive ids (a failed one between two would leave a gap), each the other mode.
        let pairs: Vec<_> = stats.windows(2).filter(|w| w[1].id == w[0].id + 1).collect();
        assert!(pairs.len() >= 6, "{} consecutive pairs in {stats:?}", pairs.len());
        for w in pairs {
            assert_ne!(w[0].mode, w[1].mode, "checkpoints {} and {} went one way", w[0].id, w[1].id);
        }
        // The first ones before the turns began went the job's own (aligned) way; after that
        // both modes are there.
        for mode in [CheckpointMode::Aligned, CheckpointMode::Unaligned] {
            assert!(stats.iter().filter(|s| s.mode == Some(mode)).count() >= 3, "{mode}: {stats:?}");
        }
    }
}

mod zipf {
    use weir_jobs::zipf::*;

    /// The draws follow the law: each of the first ranks' share within a few percent of
    /// `k^-s / H(n, s)`, for exponents below, at and above 1.
    #[test]
    fn ranks_follow_zipfs_law() {
        let draws = 200_000u64;
        for (n, s) in [(1000u64, 0.8), (1000, 1.0), (20_000_000, 1.2)] {
            let z = Zipf::new(n, s);
            let mut counts = [0u64; 6];
            for i in 0..draws {
                let k = z.rank(i);
                assert!((1..=n).contains(&k), "rank {k} of {n}");
                if k < 6 {
                    counts[k as usize] += 1;
                }
            }
            let harmonic: f64 = (1..=n.min(5_000_000)).map(|k| (k as f64).powf(-s)).sum();
            for (k, &c) in counts.iter().enumerate().skip(1) {
                let expected = (k as f64).powf(-s) / harmonic * draws as f64;
                let off = (c as f64 - expected).abs() / expected;
                assert!(off < 0.06, "n {n}, s {s}: rank {k} drawn {c} times, expected {expected:.0}");
            }
        }
    }

    /// The ranks past the alias table's head carry the tail's mass: for 20 M keys at s = 1,
    /// `(ln(n + 0.5) - ln(4096.5)) / H(n, 1)` of the draws (about 49%), each within the range.
    #[test]
    fn the_tail_past_the_table_carries_its_share() {
        let (n, draws) = (20_000_000u64, 200_000u64);
        let z = Zipf::new(n, 1.0);
        let tail = (0..draws).map(|i| z.rank(i)).filter(|&k| k > 4096).count() as f64 / draws as f64;
        let harmonic: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
        let expected = (((n as f64) + 0.5).ln() - 4096.5f64.ln()) / harmonic;
        assert!((tail - expected).abs() < 0.01, "tail share {tail:.4}, expected {expected:.4}");
    }

    #[test]
    fn a_draw_is_a_function_of_its_index() {
        let z = Zipf::new(50, 1.1);
        let first: Vec<u64> = (0..100).map(|i| z.rank(i)).collect();
        assert_eq!(first, (0..100).map(|i| z.rank(i)).collect::<Vec<_>>());
        assert!(first.iter().any(|&k| k > 1), "not all on the hottest key");
        assert_eq!(Zipf::new(1, 2.0).rank(7), 1, "one key");
    }
}
