//! The `weir` command as a user runs it: help, the default job, word count, Ctrl-C, and a
//! clear error with a non-zero exit for every bad argument.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn weir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir")).args(args).output().expect("weir runs")
}

/// Runs `weir` with `args`, which must fail with a message containing `needle` (and no panic).
fn assert_refused(args: &[&str], needle: &str) {
    let o = weir(args);
    let t = text_of(&o);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(t.contains(needle), "{args:?}: the message should name {needle:?}: {t}");
    assert!(!t.contains("panicked"), "{args:?} panicked: {t}");
}

fn text_of(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn help_on_every_command() {
    for args in [vec!["--help"], vec!["wordcount", "--help"], vec!["help", "wordcount"]] {
        let o = weir(&args);
        assert!(o.status.success(), "{args:?}: {}", text_of(&o));
        assert!(text_of(&o).contains("Usage"), "{args:?}");
    }
    assert!(text_of(&weir(&["--help"])).contains("wordcount"));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let not_empty = dir.path().join("full");
    std::fs::create_dir(&not_empty).unwrap();
    std::fs::write(not_empty.join("x"), "x").unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--workers".into(), "0".into()], "--workers"),
        (vec!["--workers".into(), "lots".into()], "--workers"),
        (vec!["--rate".into(), "abc".into()], "--rate"),
        (vec!["--rate".into(), "0".into()], "positive"),
        (vec!["--duration-s".into(), "-1".into()], "--duration-s"),
        (vec!["--keys".into(), "0".into()], "--keys"),
        (vec!["--parallelism".into(), "1000".into()], "--parallelism"),
        (vec!["--ring-capacity".into(), "0".into()], "--ring-capacity"),
        (vec!["--no-such-flag".into()], "--no-such-flag"),
        (vec!["wordcount".into()], "--input"),
        (
            vec![
                "wordcount".into(),
                "--input".into(),
                "/no/such/file".into(),
                "--output".into(),
                dir.path().join("o").display().to_string(),
            ],
            "/no/such/file",
        ),
        (
            vec![
                "wordcount".into(),
                "--input".into(),
                input.display().to_string(),
                "--output".into(),
                not_empty.display().to_string(),
            ],
            "not empty",
        ),
        (
            vec![
                "wordcount".into(),
                "--input".into(),
                input.display().to_string(),
                "--output".into(),
                input.display().to_string(),
            ],
            "not a folder",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refused(&args, needle);
    }
}

#[test]
fn wordcount_writes_running_counts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "The river, the WEIR.\nthe end\n").unwrap();
    let out = dir.path().join("out");
    let o = weir(&[
        "wordcount",
        "--input",
        dir.path().join("a.txt").to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--parallelism",
        "2",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", text_of(&o));
    let mut lines: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flat_map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap().lines().map(String::from).collect::<Vec<_>>())
        .collect();
    lines.sort();
    assert_eq!(lines, ["end\t1", "river\t1", "the\t1", "the\t2", "the\t3", "weir\t1"]);
}

#[test]
fn the_default_job_reports_throughput_and_latency() {
    let o = weir(&["--duration-s", "0.5", "--workers", "2", "--no-progress"]);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    for needle in ["records (sources)", "throughput", "latency p50", "latency p99", "latency p99.9", "latency max"] {
        assert!(t.contains(needle), "summary lacks {needle}: {t}");
    }
}

#[test]
fn ctrl_c_stops_the_default_job_with_a_summary() {
    let child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--duration-s", "120", "--workers", "2", "--no-progress"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let started = Instant::now();
    let o = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(60), "Ctrl-C did not stop the job");
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("throughput"), "{t}");
}

#[test]
fn wordcount_with_checkpoints_and_the_checkpoints_command() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let text: String = (0..200_000).map(|i| format!("weir river {} dam\n", i % 50)).collect();
    std::fs::write(&input, text).unwrap();
    let (out, chk) = (dir.path().join("out"), dir.path().join("chk"));
    let args = [
        "wordcount",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--checkpoint-dir",
        chk.to_str().unwrap(),
        "--interval-ms",
        "2",
        "--retain",
        "2",
        "--no-progress",
    ];
    let o = weir(&args);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("checkpoints completed"), "{t}");
    let lines: usize = std::fs::read_dir(&out)
        .unwrap()
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap().lines().count())
        .sum();
    assert_eq!(lines, 800_000, "one line per word occurrence");

    // Running it again with the same checkpoint directory does nothing and says why: the job
    // completed.
    let o = weir(&args);
    assert!(o.status.success());
    assert!(text_of(&o).contains("already complete"), "{}", text_of(&o));
    // With another output it is another job, whose directory this is not.
    let out2 = dir.path().join("out2");
    let mut again = args.to_vec();
    again[4] = out2.to_str().unwrap();
    let o = weir(&again);
    assert!(!o.status.success());
    assert!(
        text_of(&o).contains("holds another job") && text_of(&o).contains(out.to_str().unwrap()),
        "{}",
        text_of(&o)
    );
    assert!(!out2.exists(), "a completed job is not run again");

    let o = weir(&["checkpoints", chk.to_str().unwrap()]);
    let t = text_of(&o);
    if t.contains("no checkpoints") {
        return; // the job finished before its first checkpoint completed
    }
    assert!(o.status.success(), "{t}");
    assert!(t.contains("valid"), "{t}");
    // The completion marker is said below the table, not as a row whose status is its
    // description (which made the status column 105 characters wide).
    let marker = t.lines().find(|l| l.contains("finished")).unwrap_or_else(|| panic!("{t}"));
    assert!(marker.starts_with("_finished: the job 'wordcount' finished"), "{t}");
    let status_width = t.lines().next().unwrap().split('+').nth(2).unwrap().len();
    assert!(status_width < 20, "{t}");
    // Damage one state file: the checkpoint is reported damaged, with a non-zero exit.
    let chk_dir = std::fs::read_dir(&chk).unwrap().map(|e| e.unwrap().path()).find(|p| p.is_dir()).unwrap();
    let state = std::fs::read_dir(&chk_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "state"))
        .unwrap();
    let mut bytes = std::fs::read(&state).unwrap();
    let last = bytes.len() - 12;
    bytes[last] ^= 0xff;
    std::fs::write(&state, bytes).unwrap();
    let o = weir(&["checkpoints", chk.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text_of(&o).contains("DAMAGED"), "{}", text_of(&o));
}

#[test]
fn checkpoint_flags_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b\n").unwrap();
    let base = ["wordcount", "--input", input.to_str().unwrap(), "--output"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--interval-ms", "5"], "need --checkpoint-dir"),
        (vec!["--min-pause-ms", "5"], "--min-pause-ms needs checkpoints"),
        (vec!["--checkpoint-dir", "/proc/no-such-place", "--interval-ms", "5"], "checkpoint directory"),
        (vec!["--checkpoint-dir", "CHK", "--interval-ms", "0"], "interval-ms must be at least 1"),
        (vec!["--checkpoint-dir", "CHK", "--mode", "sometimes"], "--mode"),
        (vec!["--checkpoint-dir", "CHK", "--mode", "at-least-once", "--unaligned"], "unaligned"),
        (
            vec!["--checkpoint-dir", "CHK", "--alignment-timeout-ms", "5"],
            "an aligned-checkpoint timeout needs unaligned checkpoints turned on",
        ),
        (vec!["--checkpoint-dir", "CHK", "--retain", "0"], "retained must be from 1 to 1000"),
        (vec!["--checkpoint-dir", "CHK", "--max-concurrent", "0"], "max-concurrent must be from 1 to 64"),
    ];
    for (i, (extra, needle)) in cases.into_iter().enumerate() {
        let out = dir.path().join(format!("out{i}"));
        let chk = dir.path().join(format!("chk{i}"));
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.push(out.display().to_string());
        args.extend(extra.iter().map(|s| if *s == "CHK" { chk.display().to_string() } else { s.to_string() }));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refused(&args, needle);
    }
}

/// A user met `--mode`/`--unaligned` on wordcount against `--checkpoint aligned|…` on bench,
/// no `--checkpoint-dir` on nexmark and no `--min-pause` anywhere: every command that
/// checkpoints now takes one set of flags (Flink's names), and a TOML file with the same keys,
/// the flags overriding it.
#[test]
fn every_checkpointing_command_takes_one_set_of_flags_and_a_file() {
    let flags = [
        "--config",
        "--checkpoint ",
        "--checkpoint-dir",
        "--interval-ms",
        "--mode",
        "--unaligned",
        "--aligned-checkpoint-timeout-ms",
        "--inflight-budget-bytes",
        "--checkpoint-timeout-ms",
        "--min-pause-ms",
        "--max-concurrent",
        "--tolerable-failed-checkpoints",
        "--retained",
        "--incremental",
        "--local-recovery",
        "--changelog",
        "--materialize-every",
        "--restart-strategy",
        "--restart-attempts",
        "--restart-delay-ms",
        "--restart-max-delay-ms",
        "--restart-backoff-multiplier",
        "--restart-failures-per-interval",
        "--restart-failure-rate-interval-ms",
    ];
    for command in ["wordcount", "bench", "nexmark"] {
        let help = text_of(&weir(&[command, "--help"]));
        for flag in flags {
            assert!(help.contains(flag), "weir {command} --help lacks {flag}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("checkpoints.toml");
    // The file's mode and interval, the flag's interval over it.
    std::fs::write(
        &file,
        "checkpoint = \"unaligned\"\ninterval-ms = 5000\nretained = 3\nrestart-strategy = \"failure-rate\"\n",
    )
    .unwrap();
    let json = dir.path().join("r.json");
    let args = ["bench", "--config", file.to_str().unwrap(), "--interval-ms", "100", "--duration-s", "1"];
    let o = weir(&[&args[..], &["--no-progress", "--json", json.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", text_of(&o));
    assert!(text_of(&o).contains("checkpoints unaligned every 100 ms"), "{}", text_of(&o));
    let results = std::fs::read_to_string(&json).unwrap();
    assert!(
        results.contains("\"alignment\": \"unaligned\"") && results.contains("\"interval_ms\": 100.0"),
        "{results}"
    );
    // The Flink spellings say the same as the one word; where they disagree, the error names both.
    let refused: [(&[&str], &str); 4] = [
        (&["bench", "--checkpoint", "aligned", "--unaligned"], "checkpoint mode aligned and unaligned=true disagree"),
        (&["bench", "--unaligned", "--mode", "at-least-once"], "cannot be combined"),
        (
            &["bench", "--checkpoint", "unaligned", "--restart-attempts", "2"],
            "--restart-attempts needs --restart-strategy",
        ),
        (&["bench", "--checkpoint", "unaligned", "--restart-strategy", "sometimes"], "exponential-delay"),
    ];
    for (args, needle) in refused {
        assert_refused(args, needle);
    }
    // Where they agree, they are taken: at-least-once is not unaligned.
    let o =
        weir(&["bench", "--checkpoint", "at-least-once", "--unaligned=false", "--duration-s", "0.5", "--no-progress"]);
    assert!(o.status.success() && text_of(&o).contains("checkpoints at-least-once"), "{}", text_of(&o));
    // A file's unknown key or wrongly typed value: named, with the file.
    for (text, needle) in
        [("interval-ms = 100\nbogus = 1\n", "unknown field `bogus`"), ("retained = \"many\"\n", "retained")]
    {
        std::fs::write(&file, text).unwrap();
        for command in [&["bench"][..], &["nexmark", "--query", "q1"][..]] {
            let args = [command, &["--config", file.to_str().unwrap()][..]].concat();
            assert_refused(&args, needle);
            assert_refused(&args, "checkpoints.toml");
        }
    }
    assert_refused(&["bench", "--config", "/no/such/file.toml"], "/no/such/file.toml");
    // Milliseconds are durations too, with their unit, in flags and in the file; an unknown
    // unit is named.
    std::fs::write(&file, "interval-ms = \"0.2s\"\ncheckpoint = \"aligned\"\n").unwrap();
    for args in [&["--interval-ms", "0.2s"][..], &["--config", file.to_str().unwrap()][..]] {
        let o = weir(&[&["bench", "--duration-s", "0.5", "--no-progress"][..], args].concat());
        assert!(o.status.success() && text_of(&o).contains("every 200 ms"), "{args:?}: {}", text_of(&o));
    }
    assert_refused(&["bench", "--interval-ms", "2x"], "'2x' has the unknown unit 'x'");
    assert_refused(&["bench", "--min-pause-ms", "0.5ms"], "'0.5ms' is not a duration in milliseconds");
    std::fs::write(&file, "interval-ms = \"soon\"\n").unwrap();
    assert_refused(&["bench", "--config", file.to_str().unwrap()], "'soon' is not a duration");
    // A FIFO blocked the command for ever, and /dev/zero was read until memory ran out.
    let fifo = dir.path().join("fifo.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    assert_refused(&["bench", "--config", fifo.to_str().unwrap()], "not a plain file");
    assert_refused(&["bench", "--config", "/dev/zero"], "/dev/zero: not a plain file");
    std::fs::write(&file, "# ".repeat(600_000)).unwrap();
    assert_refused(&["bench", "--config", file.to_str().unwrap()], "larger than 1048576 bytes");
}

/// Every committed `word<TAB>count` line of a word count's output folder, counts by word.
fn committed_counts(out: &std::path::Path) -> std::collections::HashMap<String, Vec<u64>> {
    let mut counts: std::collections::HashMap<String, Vec<u64>> = std::collections::HashMap::new();
    for f in std::fs::read_dir(out).unwrap() {
        let f = f.unwrap().path();
        if f.file_name().unwrap().to_str().unwrap().starts_with('.') {
            continue;
        }
        for line in std::fs::read_to_string(f).unwrap().lines() {
            let (w, c) = line.split_once('\t').unwrap();
            counts.entry(w.to_string()).or_default().push(c.parse().unwrap());
        }
    }
    for c in counts.values_mut() {
        c.sort_unstable();
    }
    counts
}

#[test]
fn sigterm_stops_wordcount_with_a_savepoint_and_restore_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let text: String = (0..3_000_000).map(|i| format!("weir river {} dam\n", i % 50)).collect();
    std::fs::write(&input, text).unwrap();
    let (out, sp) = (dir.path().join("out"), dir.path().join("sp"));
    // Unaligned checkpoints at parallelism 2, the restore at 3 (a savepoint is aligned: it
    // holds no in-flight data, and rescales like any).
    let child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["wordcount", "--input", input.to_str().unwrap(), "--output", out.to_str().unwrap()])
        .args(["--checkpoint-dir", dir.path().join("chk1").to_str().unwrap(), "--unaligned", "--parallelism", "2"])
        .args(["--savepoint-dir", sp.to_str().unwrap(), "--no-progress"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let o = child.wait_with_output().unwrap();
    let t = text_of(&o);
    let Some(path) = t.lines().find_map(|l| l.strip_prefix("stopped with savepoint ")) else {
        // The job finished before the signal arrived; nothing to resume.
        assert!(o.status.success(), "{t}");
        return;
    };
    assert!(o.status.success(), "{t}");
    let o = weir(&[
        "wordcount",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--checkpoint-dir",
        dir.path().join("chk2").to_str().unwrap(),
        "--restore",
        path.trim(),
        "--parallelism",
        "3",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", text_of(&o));
    let counts = committed_counts(&out);
    assert_eq!(counts.len(), 53);
    for (w, c) in counts {
        let n = if w == "weir" || w == "river" || w == "dam" { 3_000_000 } else { 60_000 };
        assert_eq!(c, (1..=n).collect::<Vec<u64>>(), "{w}: every count exactly once across the stop");
    }
}

/// The user's case: an unaligned checkpoint holding in-flight data restores at another
/// parallelism (it was refused: "it can be restored only at that parallelism"), its in-flight
/// records re-routed by key, and the output is exact. The first run's checkpoints are all
/// retained; the restore starts from the one with the most in-flight data, in a copy of the
/// output as it was committed then.
#[test]
fn an_unaligned_checkpoint_with_in_flight_data_restores_at_another_parallelism_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let text: String = (0..150_000u64).map(|i| format!("a{} b{} c{}\n", i % 97, (i * 7) % 13, i % 1009)).collect();
    std::fs::write(&input, text).unwrap();
    let (out, chk) = (dir.path().join("out"), dir.path().join("chk"));
    let o = weir(&[
        "wordcount",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--checkpoint-dir",
        chk.to_str().unwrap(),
        "--unaligned",
        "--interval-ms",
        "2",
        "--retain",
        "1000",
        "--parallelism",
        "2",
        "--ring-capacity",
        "64",
        "--batch-size",
        "16",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", text_of(&o));
    let expected = committed_counts(&out);
    let (id, inflight) = std::fs::read_dir(&chk)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_prefix("chk-")?.parse::<u64>().ok())
        .map(|id| (id, weir::checkpoint::read_metadata(&chk.join(format!("chk-{id}"))).unwrap().stats.inflight_bytes))
        .max_by_key(|&(id, bytes)| (bytes, id))
        .expect("checkpoints were retained");
    // A word count's keyed stage is its slowest: its rings are full at most checkpoints.
    assert!(inflight > 1_000, "no retained checkpoint holds in-flight records (the most: {inflight} bytes)");
    for p in ["1", "3"] {
        // The output as the checkpoint left it: files committed under checkpoints after it
        // never were.
        let out_p = dir.path().join(format!("out{p}"));
        std::fs::create_dir(&out_p).unwrap();
        for f in std::fs::read_dir(&out).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_str().unwrap().to_string();
            let txn: u64 = name.rsplit('-').next().unwrap().trim_end_matches(".pending").parse().unwrap();
            if txn <= id {
                std::fs::copy(&f, out_p.join(&name)).unwrap();
            }
        }
        let o = weir(&[
            "wordcount",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out_p.to_str().unwrap(),
            "--checkpoint-dir",
            dir.path().join(format!("chk{p}")).to_str().unwrap(),
            "--restore",
            chk.join(format!("chk-{id}")).to_str().unwrap(),
            "--parallelism",
            p,
            "--no-progress",
        ]);
        let t = text_of(&o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains(&format!("restored from checkpoint {id}")), "{t}");
        assert!(committed_counts(&out_p) == expected, "restored at parallelism {p} from chk-{id}: the counts differ");
    }
}

#[test]
fn bench_runs_a_workload_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = weir(&[
        "bench",
        "--workload",
        "window",
        "--checkpoint",
        "unaligned",
        "--interval-ms",
        "100",
        "--duration-s",
        "0.6",
        "--rate",
        "500000",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ]);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("throughput") && t.contains("checkpoints completed"), "{t}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["workload"], "window");
    assert_eq!(v["checkpoint"], "unaligned");
    assert!(v["records"].as_u64().unwrap() > 0);
    assert!(v["latency_ns"]["p999"].as_u64().is_some(), "{v}");
    let checkpoints = v["checkpoints"].as_array().unwrap();
    assert!(!checkpoints.is_empty(), "{v}");
    for field in ["id", "duration_ms", "alignment_ms", "state_bytes", "incremental_bytes", "inflight_bytes"] {
        assert!(!checkpoints[0][field].is_null(), "{field}");
    }
    assert_refused(&["bench", "--workload", "fast"], "stateless");
    assert_refused(&["bench", "--checkpoint", "sometimes"], "unaligned");
    assert_refused(&["bench", "--json", "/no/such/dir/r.json", "--duration-s", "0.1"], "/no/such/dir/r.json");
}

#[test]
fn nexmark_queries_check_against_the_sequential_implementation() {
    for q in ["q0", "q5", "q8", "q11", "q19"] {
        let o = weir(&["nexmark", "--query", q, "--events", "200000", "--check", "--no-progress"]);
        let t = text_of(&o);
        assert!(o.status.success(), "{q}: {t}");
        assert!(t.contains("the same as the sequential implementation"), "{q}: {t}");
        assert!(t.contains("per core"), "{q}: {t}");
    }
    // A growing-state query with incremental checkpoints: the same rows.
    let chk = tempfile::tempdir().unwrap();
    let dir = chk.path().join("chk");
    let args =
        ["--checkpoint", "aligned", "--incremental", "--interval-ms", "20", "--checkpoint-dir", dir.to_str().unwrap()];
    let o =
        weir(&[&["nexmark", "--query", "q18", "--events", "300000", "--check", "--no-progress"][..], &args].concat());
    let t = text_of(&o);
    assert!(o.status.success() && t.contains("the same as the sequential implementation"), "{t}");
    assert!(t.contains("(incremental)"), "{t}");
    // Each retained checkpoint's own bytes and the earlier files it refers to.
    let o = weir(&["checkpoints", dir.to_str().unwrap()]);
    let t = text_of(&o);
    assert!(o.status.success() && t.contains("own bytes") && t.contains("shared bytes"), "{t}");
    assert_refused(&["nexmark", "--query", "q1", "--events", "5000000", "--check"], "at most");
}

/// q10 logs every bid to files partitioned by day and minute; with checkpoints every 20 ms
/// the files read back hold each bid once, as the sequential implementation writes them, and a
/// second run into the same folder replaces the first's files.
#[test]
fn nexmark_q10_writes_partitioned_files_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q10");
    let out_arg = out.to_str().unwrap();
    for extra in [&["--checkpoint", "aligned", "--interval-ms", "20"][..], &[][..]] {
        let args = ["nexmark", "--query", "q10", "--events", "300000", "--output", out_arg, "--check", "--no-progress"];
        let o = weir(&[&args[..], extra].concat());
        let t = text_of(&o);
        assert!(o.status.success(), "{extra:?}: {t}");
        assert!(t.contains("lines in 1 partitions, the same as the sequential implementation"), "{extra:?}: {t}");
    }
    // 300,000 events at 100 µs are 30 s of event time: all in minute 00:00 of 1970-01-01.
    let files: Vec<_> =
        std::fs::read_dir(out.join("dt=1970-01-01/hm=00:00")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files.len(), 2, "one file per subtask: {files:?}");
    assert_refused(&["nexmark", "--query", "q10"], "--output DIR");
    assert_refused(&["nexmark", "--query", "q1", "--output", out_arg], "--output is for q10");
}

/// Every flag of every command, given a wrong value (or given where it means nothing): a
/// message naming the problem and a non-zero exit, never a panic. `IN` stands for a small
/// input file, `OUT`/`CHK` for fresh folders, `FILE` for an existing plain file.
#[test]
fn every_flag_refuses_a_wrong_value() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b\n").unwrap();
    let wc = ["wordcount", "--input", "IN", "--output", "OUT"];
    let wc_chk = ["wordcount", "--input", "IN", "--output", "OUT", "--checkpoint-dir", "CHK"];
    let runtime: [(&[&str], &str); 7] = [
        (&["--workers", "0"], "--workers"),
        (&["--workers", "two"], "--workers"),
        (&["--parallelism", "0"], "--parallelism"),
        (&["--ring-capacity", "-5"], "-5"),
        (&["--batch-size", "0"], "--batch-size"),
        (&["--no-pin=yes"], "--no-pin"),
        (&["--no-progress=1"], "--no-progress"),
    ];
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        // The default job.
        (vec!["--duration-s", "0"], "positive"),
        (vec!["--duration-s", "inf"], "positive"),
        (vec!["--rate", "-3"], "positive"),
        (vec!["--keys", "many"], "--keys"),
        (vec!["--window-ms", "0"], "--window-ms"),
        (vec!["--window-ms", "3600001"], "--window-ms"),
        // Word count.
        (vec!["wordcount", "--input", "IN"], "--output"),
        (vec!["wordcount", "--input", "IN", "--output", "FILE"], "not a folder"),
        (vec!["wordcount", "--input", "/no/such/in", "--output", "OUT"], "/no/such/in"),
        ([&wc[..], &["--follow=3"]].concat(), "--follow"),
        ([&wc[..], &["--incremental"]].concat(), "--incremental needs checkpoints"),
        ([&wc[..], &["--changelog"]].concat(), "--changelog needs checkpoints"),
        ([&wc_chk[..], &["--materialize-every", "0"]].concat(), "materialization interval must be at least one"),
        (
            [&wc_chk[..], &["--changelog=false", "--materialize-every", "3"]].concat(),
            "--changelog=false turns them off",
        ),
        ([&wc[..], &["--unaligned"]].concat(), "need --checkpoint-dir"),
        ([&wc[..], &["--retain", "2"]].concat(), "--retained needs checkpoints"),
        ([&wc[..], &["--interval-during-backlog-ms", "9"]].concat(), "--interval-during-backlog-ms needs checkpoints"),
        ([&wc[..], &["--savepoint-dir", "CHK"]].concat(), "--savepoint-dir needs --checkpoint-dir"),
        ([&wc[..], &["--allow-non-restored-state"]].concat(), "needs --restore"),
        ([&wc[..], &["--restore", "/no/such/savepoint-3"]].concat(), "does not exist"),
        ([&wc[..], &["--restore", "FILE"]].concat(), "not a folder"),
        ([&wc[..], &["--restore", "CHK"]].concat(), "no _metadata"),
        ([&wc_chk[..], &["--checkpoint-dir", "FILE"]].concat(), "cannot be used multiple times"),
        (vec!["wordcount", "--input", "IN", "--output", "OUT", "--checkpoint-dir", "FILE"], "checkpoint directory"),
        ([&wc_chk[..], &["--savepoint-dir", "FILE"]].concat(), "savepoint directory"),
        ([&wc_chk[..], &["--interval-ms", "-1"]].concat(), "-1"),
        ([&wc_chk[..], &["--max-concurrent", "65"]].concat(), "max-concurrent must be from 1 to 64"),
        ([&wc_chk[..], &["--retain", "1001"]].concat(), "retained must be from 1 to 1000"),
        ([&wc[..], &["--checkpoint-timeout-ms", "50"]].concat(), "--checkpoint-timeout-ms needs checkpoints"),
        ([&wc_chk[..], &["--checkpoint-timeout-ms", "0"]].concat(), "checkpoint-timeout-ms must be at least 1"),
        ([&wc_chk[..], &["--tolerable-failures", "some"]].concat(), "--tolerable-failed-checkpoints"),
        ([&wc[..], &["--tolerable-failures", "2"]].concat(), "--tolerable-failed-checkpoints needs checkpoints"),
        (
            [&wc_chk[..], &["--unaligned", "--alignment-timeout-ms", "0"]].concat(),
            "aligned-checkpoint-timeout-ms must be at least 1",
        ),
        (
            [&wc[..], &["--inflight-budget-bytes", "1000"]].concat(),
            "an in-flight budget needs unaligned checkpoints turned on",
        ),
        ([&wc_chk[..], &["--inflight-budget-bytes", "1000"]].concat(), "needs unaligned"),
        (
            [&wc_chk[..], &["--unaligned", "--inflight-budget-bytes", "0"]].concat(),
            "inflight-budget-bytes must be at least 1",
        ),
        ([&wc_chk[..], &["--unaligned", "--inflight-budget-bytes", "-4"]].concat(), "-4"),
        (
            [&wc_chk[..], &["--unaligned", "--inflight-budget-bytes", "9", "--alignment-timeout-ms", "5"]].concat(),
            "cannot be combined",
        ),
        // The checkpoints listing.
        (vec!["checkpoints"], "<DIR>"),
        (vec!["checkpoints", "/no/such/dir"], "/no/such/dir"),
        (vec!["checkpoints", "FILE"], "not a directory"),
        // Benchmarks.
        (vec!["bench", "--workload", "heavy"], "stateless"),
        (vec!["bench", "--checkpoint", "yes"], "aligned"),
        (vec!["bench", "--interval-ms", "0"], "interval-ms must be at least 1"),
        (vec!["bench", "--retained", "2"], "--retained needs checkpoints"),
        (vec!["bench", "--checkpoint", "none", "--checkpoint-dir", "CHK"], "--checkpoint-dir needs checkpoints"),
        (vec!["bench", "--checkpoint", "aligned", "--checkpoint-dir", "FILE", "--no-progress"], "checkpoint directory"),
        (vec!["bench", "--duration-s", "-2"], "positive"),
        (vec!["bench", "--rate", "NaN"], "positive"),
        (vec!["bench", "--keys", "0"], "--keys"),
        (
            vec!["bench", "--checkpoint", "aligned", "--alignment-timeout-ms", "5"],
            "an aligned-checkpoint timeout is for checkpoint mode aligned-timeout",
        ),
        (
            vec!["bench", "--checkpoint", "aligned-timeout", "--alignment-timeout-ms", "0"],
            "aligned-checkpoint-timeout-ms must be at least 1",
        ),
        (
            vec!["bench", "--checkpoint", "unaligned", "--inflight-budget-bytes", "5"],
            "an in-flight budget is for checkpoint mode adaptive",
        ),
        (
            vec!["bench", "--checkpoint", "adaptive", "--inflight-budget-bytes", "0", "--no-progress"],
            "inflight-budget-bytes must be at least 1",
        ),
        // The keyed workload's rings hold 4 × 4096 entries of 32 bytes.
        (
            vec!["bench", "--checkpoint", "adaptive", "--inflight-budget-bytes", "100000000", "--no-progress"],
            "above what the job's rings hold",
        ),
        (vec!["bench", "--sink-cost-ns", "0"], "--sink-cost-ns"),
        (vec!["bench", "--sink-cost-ns", "2000000000"], "--sink-cost-ns"),
        (vec!["bench", "--json", "/no/such/dir/r.json"], "/no/such/dir/r.json"),
        // Nexmark.
        (vec!["nexmark"], "--query"),
        (vec!["nexmark", "--query", "q23"], "q9, q10, q11"),
        (vec!["nexmark", "--query", "q10"], "--output DIR"),
        (vec!["nexmark", "--query", "q1", "--output", "/tmp/x"], "--output is for q10"),
        (vec!["nexmark", "--query", "q1", "--events", "0"], "--events"),
        (vec!["nexmark", "--query", "q1", "--events", "1e6"], "--events"),
        (vec!["nexmark", "--query", "q1", "--rate", "0"], "positive"),
        (vec!["nexmark", "--query", "q1", "--checkpoint", "exactly"], "unaligned"),
        (vec!["nexmark", "--query", "q1", "--interval-ms", "0"], "--interval-ms"),
        (vec!["nexmark", "--query", "q1", "--retained", "3"], "--retained needs checkpoints"),
        (vec!["nexmark", "--query", "q1", "--incremental"], "--incremental needs checkpoints"),
        (vec!["nexmark", "--query", "q1", "--checkpoint", "alternate:aligned,unaligned"], "weir bench's"),
        (vec!["nexmark", "--query", "q1", "--check", "--events", "2000001"], "at most"),
        (vec!["nexmark", "--query", "q1", "--check=no"], "--check"),
    ];
    for prefix in [&[][..], &["bench"][..], &["nexmark", "--query", "q0"][..], &wc[..]] {
        for (flag, needle) in runtime {
            cases.push(([prefix, flag].concat(), needle));
        }
    }
    for (i, (args, needle)) in cases.into_iter().enumerate() {
        let file = dir.path().join("plain-file");
        std::fs::write(&file, "x").unwrap();
        let substitute = |a: &str| match a {
            "IN" => input.display().to_string(),
            "OUT" => dir.path().join(format!("out{i}")).display().to_string(),
            "CHK" => dir.path().join(format!("chk{i}")).display().to_string(),
            "FILE" => file.display().to_string(),
            other => other.to_string(),
        };
        if args.contains(&"CHK") && args.contains(&"--restore") {
            std::fs::create_dir_all(substitute("CHK")).unwrap();
        }
        let args: Vec<String> = args.iter().map(|a| substitute(a)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refused(&args, needle);
    }
}

#[test]
fn simulate_runs_seeds_and_refuses_bad_input() {
    let o = weir(&["simulate", "--job", "keyed", "--mode", "unaligned", "--parallelism", "2", "--seeds", "0..40"]);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("40 seeds, 0 differ from the golden run"), "{t}");
    // One seed, as a failing seed's rerun command gives it.
    let o = weir(&["simulate", "--job", "wordcount", "--incremental", "--seeds", "7"]);
    assert!(o.status.success() && text_of(&o).contains("1 seeds, 0 differ"), "{}", text_of(&o));
    for (args, needle) in [
        (vec!["--job", "join", "--seeds", "5..5"], "empty"),
        (vec!["--job", "join", "--seeds", "9..3"], "empty"),
        (vec!["--job", "join", "--seeds", "a..b"], "not a seed"),
        (vec!["--job", "sql", "--seeds", "0..2"], "wordcount, window, join, keyed"),
        (vec!["--job", "join", "--mode", "exactly", "--seeds", "0..2"], "aligned, unaligned, aligned-timeout"),
        (vec!["--job", "join", "--parallelism", "0", "--seeds", "0..2"], "parallelism"),
        (vec!["--job", "join"], "--seeds"),
    ] {
        let mut full = vec!["simulate"];
        full.extend(args);
        assert_refused(&full, needle);
    }
}

/// `--help` listed neither the backlog and mixed workloads nor the modes nexmark and simulate
/// take: every flag with a fixed set of values now lists them all, from the values themselves.
#[test]
fn help_lists_every_value_a_flag_takes() {
    let help = |cmd: &str| text_of(&weir(&[cmd, "--help"]));
    let bench = help("bench");
    for w in weir_jobs::bench::Workload::ALL {
        assert!(bench.contains(&format!("{w}")), "bench --help lacks workload {w}: {bench}");
    }
    let nexmark = help("nexmark");
    for c in weir::checkpoint::ModeKind::ALL.map(|m| m.name()).into_iter().chain(["none"]) {
        assert!(nexmark.contains(c), "nexmark --help lacks --checkpoint {c}: {nexmark}");
    }
    let simulate = help("simulate");
    for m in weir::checkpoint::ModeKind::ALL {
        assert!(simulate.contains(&format!("{m}")), "simulate --help lacks --mode {m}: {simulate}");
    }
    for j in weir_jobs::simulated::SimJob::ALL {
        assert!(simulate.contains(&format!("{j}")), "simulate --help lacks --job {j}: {simulate}");
    }
    assert!(bench
        .contains("[possible values: stateless, keyed, window, join, backpressure, sparse-window, backlog, mixed]"));
}

/// The documented default in-flight budget (1 MiB) was refused on the default rings of the
/// backpressure workload (they hold 512 KiB): the default now fits the job's rings, and the
/// adaptive checkpoints complete. A budget given explicitly is still checked.
#[test]
fn the_default_inflight_budget_fits_the_default_rings() {
    let o = weir(&[
        "bench",
        "--workload",
        "backpressure",
        "--checkpoint",
        "adaptive",
        "--duration-s",
        "1.5",
        "--no-progress",
    ]);
    let t = text_of(&o);
    assert!(o.status.success() && t.contains("checkpoints completed:"), "{t}");
    let o = weir(&[
        "bench",
        "--workload",
        "backpressure",
        "--checkpoint",
        "adaptive",
        "--inflight-budget-bytes",
        "1048576",
        "--duration-s",
        "1",
        "--no-progress",
    ]);
    assert!(!o.status.success() && text_of(&o).contains("above what the job's rings hold"), "{}", text_of(&o));
}

/// The checkpoint lab: aligned and unaligned take turns checkpoint by checkpoint in one
/// running job (through its live configuration), reported per mode and as ratios of
/// consecutive checkpoints; the unaligned ones store in-flight data, the aligned ones none.
#[test]
fn the_checkpoint_lab_alternates_modes_inside_one_run() {
    let o = weir(&[
        "bench",
        "--workload",
        "backpressure",
        "--checkpoint",
        "alternate:aligned,unaligned",
        "--interval-ms",
        "100",
        "--duration-s",
        "2",
        "--no-progress",
    ]);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    let lab = &t[t.find("the checkpoint lab (alternate:aligned,unaligned)").unwrap_or_else(|| panic!("{t}"))..];
    let row = |mode: &str| lab.lines().find(|l| l.starts_with(&format!("| {mode:>9} |"))).map(str::to_string);
    let (aligned, unaligned) = (row("aligned").expect(&t), row("unaligned").expect(&t));
    let cells = |r: &str| r.split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    assert_eq!(cells(&aligned)[5], "0", "aligned checkpoints store no in-flight data: {lab}");
    assert_ne!(cells(&unaligned)[5], "0", "unaligned ones under backpressure do: {lab}");
    assert!(lab.contains("| unaligned ÷ aligned |"), "{lab}");
    for (bad, says) in [
        ("alternate:aligned", "needs two modes or more"),
        ("alternate:none,aligned", "'none' cannot take turns"),
        ("alternate:aligned,sideways", "sideways"),
    ] {
        let o = weir(&["bench", "--checkpoint", bad, "--duration-s", "1"]);
        assert!(!o.status.success() && text_of(&o).contains(says), "{bad}: {}", text_of(&o));
    }
}

/// `cargo run --release` (no command) showed a window count with no checkpoint at all: the
/// default job now takes checkpoints (their table) and ends with the checkpoint lab under
/// backpressure, aligned against unaligned in one running job.
#[test]
fn the_default_job_shows_checkpoints_and_aligned_against_unaligned() {
    let o = weir(&["--duration-s", "3", "--workers", "2", "--no-progress"]);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("checkpoints completed: ") && !t.contains("checkpoints completed: 0"), "{t}");
    assert!(t.contains("the checkpoint lab:") && t.contains("| unaligned ÷ aligned |"), "{t}");
    let latency: Vec<&str> =
        t.lines().filter(|l| l.starts_with("| latency p") || l.starts_with("| latency max")).collect();
    let unit = |l: &str| l.trim_end_matches(" |").rsplit(' ').next().unwrap().to_string();
    assert!(latency.windows(2).all(|w| unit(w[0]) == unit(w[1])), "one latency unit: {latency:?}");
}

/// nexmark had no --checkpoint-dir and no command a --min-pause-ms: both now, with the same
/// names as wordcount's, and refused without checkpoints. The checkpoint directory is the one
/// the job used (its identity file is made at the job's start, checkpoints or not), and the
/// minimum pause is the running job's (its live configuration says so); that the pause holds
/// between checkpoints is the engine's test (`pacing`).
#[test]
fn nexmark_and_bench_take_the_checkpoint_dir_and_minimum_pause() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("chk");
    let o = weir(&[
        "nexmark",
        "--query",
        "q5",
        "--events",
        "300000",
        "--checkpoint",
        "aligned",
        "--interval-ms",
        "20",
        "--min-pause-ms",
        "5",
        "--checkpoint-dir",
        chk.to_str().unwrap(),
        "--workers",
        "2",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", text_of(&o));
    assert!(chk.join(weir::checkpoint::INSTANCE_FILE).is_file(), "the job used the checkpoint directory it was given");
    let (mut job, addr) = crate::control::bench_with_control(&[
        "--checkpoint",
        "aligned",
        "--min-pause-ms",
        "250ms",
        "--checkpoint-dir",
        dir.path().join("bench-chk").to_str().unwrap(),
        "--duration-s",
        "600",
    ]);
    let (ok, config) = crate::control::control(&addr, &["config"]);
    let _ = job.child.kill();
    let _ = job.child.wait();
    assert!(ok, "{config}");
    let config: serde_json::Value = serde_json::from_str(config.trim()).unwrap_or_else(|e| panic!("{e}: {config}"));
    assert_eq!(config["min-pause-ms"], 250, "the running job's minimum pause: {config}");
    for args in [vec!["nexmark", "--query", "q5", "--min-pause-ms", "5"], vec!["bench", "--min-pause-ms", "5"]] {
        let o = weir(&args);
        assert!(!o.status.success() && text_of(&o).contains("needs checkpoints"), "{args:?}: {}", text_of(&o));
    }
}

/// A user piped a benchmark into `head` and saw a panic ("failed printing to stdout: Broken
/// pipe"): a closed pipe ends the command quietly, as it ends `yes`.
#[test]
fn a_closed_pipe_ends_the_command_without_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "--duration-s", "0.5", "--no-progress"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its reader goes away at once, before the report is printed.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(o.status.signal(), Some(13), "ended by SIGPIPE, as yes | head: {:?}", o.status);
    }
}

/// A peer that accepts connections and never answers: its address. It holds every
/// connection until the test binary exits.
fn silent_peer() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().collect();
        drop(held);
    });
    addr
}

/// Peers that accept connections and never answer (issue 45, item 8): an S3 endpoint gave no
/// result after 110 s, a Kafka address 31 s, and `weir control` waited for ever (an hour).
/// Each is named now, as one that did not answer, and the command exits non-zero.
#[test]
fn peers_that_never_answer_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b\n").unwrap();
    let (input, out) = (input.to_str().unwrap().to_string(), dir.path().join("out").to_str().unwrap().to_string());
    let peer = silent_peer();
    let silent_s3 = {
        let (input, out, peer) = (input.clone(), out.clone(), peer.clone());
        std::thread::spawn(move || {
            Command::new(env!("CARGO_BIN_EXE_weir"))
                .args(["wordcount", "--input", &input, "--output", &out, "--checkpoint-dir", "s3://bucket/job"])
                .env("AWS_ENDPOINT_URL", format!("http://{peer}"))
                .env("AWS_ACCESS_KEY_ID", "k")
                .env("AWS_SECRET_ACCESS_KEY", "s")
                .output()
                .unwrap()
        })
    };
    let kafka = weir(&["wordcount", "--input", &format!("kafka://{peer}/lines"), "--output", &out]);
    let control_job = weir(&["control", &peer, "job"]);
    let control_stop = weir(&["control", &peer, "stop", dir.path().join("sp").to_str().unwrap()]);
    let s3 = silent_s3.join().unwrap();
    for (what, o, says) in [
        ("s3", s3, format!("the S3 endpoint http://{peer} did not answer")),
        ("kafka", kafka, format!("Kafka broker {peer} accepted the connection and did not answer")),
        (
            "control job",
            control_job,
            format!("the control endpoint at {peer} accepted the connection and did not answer"),
        ),
        ("control stop", control_stop, "did not answer GET /job".to_string()),
    ] {
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!o.status.success() && !text.contains("panicked"), "{what}: {text}");
        assert!(text.contains(&says), "{what}: {text}");
    }
}

/// Errors have their kinds (issue 45, item 9): a refused connection, a lock held by another
/// process and a refused recovery (the job already completed) all read "invalid configuration"
/// before, as a bad flag does.
#[test]
fn errors_say_their_kind() {
    use weir::checkpoint::{CheckpointConfig, CheckpointStorage, DirectoryLock};
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::for_job(dir.path().join("held"), "f");
    let _held = DirectoryLock::acquire(&storage, "a").unwrap();
    match DirectoryLock::acquire(&storage, "b") {
        Err(e @ weir::Error::InUse(_)) => assert!(e.to_string().starts_with("in use: checkpoint directory"), "{e}"),
        other => panic!("a held lock: {other:?}"),
    }
    let job = || {
        let job = weir::Job::new("done").with_checkpointing(CheckpointConfig::new(dir.path().join("chk")));
        job.generator(weir::source::Generator::new(|i, _| i).count(10)).sink(|_| Ok(weir::sink::DiscardSink));
        job
    };
    job().execute(weir::RunConfig::default()).unwrap();
    match job().execute(weir::RunConfig::default()) {
        Err(e @ weir::Error::Refused(_)) => assert!(e.to_string().contains("already completed"), "{e}"),
        other => panic!("a rerun of a completed job: {other:?}"),
    }
    // Port 1: nothing listens there.
    let o = weir(&["control", "127.0.0.1:1", "job"]);
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && text.contains("unreachable: cannot reach the control endpoint"), "{text}");
    let o = weir(&["wordcount", "--parallelism", "0"]);
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !text.contains("unreachable") && !text.contains("in use"), "{text}");
}

/// Issue 59 measures state as it grows: `weir bench --zipf S` draws keys with Zipf's law, and
/// the report says what the state held at most, per key, and the process's peak resident
/// memory (the JSON too). Before, there was no `--zipf`, and the JSON said nothing of memory.
#[test]
fn bench_draws_zipf_keys_and_reports_the_states_memory() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("z.json");
    let o = weir(&[
        "bench",
        "--workload",
        "keyed",
        "--keys",
        "50000",
        "--zipf",
        "1.1",
        "--duration-s",
        "0.5",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ]);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("Zipf's law, exponent 1.1") && t.contains("state: at most") && t.contains("bytes a key"), "{t}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["zipf"], 1.1, "{v}");
    assert!(v["state_peak_bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > v["state_peak_bytes"].as_u64().unwrap(), "{v}");
    for bad in ["-1", "NaN", "11", "lots"] {
        assert_refused(&["bench", "--zipf", bad, "--duration-s", "0.1"], &format!("'{bad}' is not a Zipf exponent"));
    }
    assert_refused(&["bench", "--workload", "window", "--zipf", "1", "--duration-s", "0.1"], "not window");
}

/// `--state-memory` on a bench of keyed state: the report says what the budget's pages did;
/// on one without keyed state it is accepted and says it has nothing to bound; values that
/// cannot work are refused, naming them.
#[test]
fn bench_keeps_keyed_state_within_state_memory_and_refuses_budgets_that_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("b.json");
    let o = weir(&[
        "bench",
        "--workload",
        "keyed",
        "--keys",
        "300000",
        "--state-memory",
        "4MiB",
        "--state-dir",
        dir.path().to_str().unwrap(),
        "--duration-s",
        "1",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ]);
    let t = text_of(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("state memory 4 MiB: at most") && t.contains("came back"), "{t}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let s = &v["state_memory"];
    assert_eq!(s["limit_bytes"], 4 << 20, "{v}");
    assert!(s["faults"].as_u64().unwrap() > 0 && s["evictions"].as_u64().unwrap() > 0, "{v}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("b.json")], "spill files are unlinked: nothing stays");
    let o =
        weir(&["bench", "--workload", "stateless", "--state-memory", "64MiB", "--duration-s", "0.3", "--no-progress"]);
    let t = text_of(&o);
    assert!(o.status.success() && t.contains("nothing to bound"), "{t}");
    for (args, says) in [
        (vec!["--state-memory", "0"], "is no room at all"),
        (vec!["--state-memory", "lots"], "is not a size"),
        (vec!["--state-memory", "12 parsecs"], "the unit \"parsecs\""),
        (vec!["--state-memory", "16KiB"], "less than a page per task"),
        (vec!["--state-memory", "64MiB", "--state-dir", "/no/such/folder"], "the state directory cannot be read"),
        (vec!["--state-dir", "/tmp"], "give --state-memory too"),
    ] {
        let mut all = vec!["bench", "--workload", "keyed", "--duration-s", "0.2"];
        all.extend(args);
        assert_refused(&all, says);
    }
}
