//! The dashboard (`GET /` of the control endpoint) in a real headless browser: Debian's
//! `chromium`, which `.ci/run` installs (and names in `WEIR_TEST_CHROMIUM`, so that there its
//! absence fails). The page, its script run, shows a running job's operators and checkpoint
//! history, aligned and unaligned checkpoints of the lab told apart, and renders to a
//! screenshot.

use std::process::Command;

use crate::common;
use crate::control::{bench_with_control, control, metric};

/// The browser: `WEIR_TEST_CHROMIUM`, or `chromium` on the path; `None` (the test says it did
/// not run) where neither is and the variable is unset.
fn chromium() -> Option<String> {
    if let Ok(path) = std::env::var("WEIR_TEST_CHROMIUM") {
        return Some(path);
    }
    let found = Command::new("sh").args(["-c", "command -v chromium"]).output().ok()?;
    found.status.success().then(|| String::from_utf8_lossy(&found.stdout).trim().to_string())
}

/// Runs the browser headless on `url` with `what` (`--dump-dom`, `--screenshot=…`), letting the
/// page's script run for four seconds of its (virtual) time.
fn browse(browser: &str, url: &str, what: &str) -> std::process::Output {
    Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1000,1400"])
        .args(["--virtual-time-budget=4000", what, url])
        .output()
        .unwrap()
}

#[test]
fn the_dashboard_shows_a_running_jobs_checkpoint_history() {
    let Some(browser) = chromium() else {
        // CI names the browser (WEIR_TEST_CHROMIUM), so there its absence fails instead.
        common::did_not_run(
            "dashboard::the_dashboard_shows_a_running_jobs_checkpoint_history",
            "no chromium on the path (apt-get install chromium; .ci/run installs it)",
        );
        return;
    };
    let (mut job, addr) = bench_with_control(&[
        "--workload",
        "backpressure",
        "--checkpoint",
        "alternate:aligned,unaligned",
        "--interval-ms",
        "100",
        "--duration-s",
        "120",
    ]);
    common::wait_until("six checkpoints", || metric(&addr, "weir_checkpoints_completed_total") >= 6.0);
    let url = format!("http://{addr}/");
    let dom = browse(&browser, &url, "--dump-dom");
    let dom = String::from_utf8_lossy(&dom.stdout).to_string();
    assert!(dom.contains("bench-backpressure"), "the job's name: {dom}");
    assert!(dom.contains("<b id=\"state\">RUNNING</b>"), "the job's state: {dom}");
    assert!(dom.contains("<b id=\"failure\">none</b>"), "its last failure: {dom}");
    assert!(dom.contains("<td>sink-3</td>"), "the operators' table: {dom}");
    assert!(dom.contains(" %</td>"), "the input rings' fill (backpressure): {dom}");
    let history = &dom[dom.find("id=\"history\"").expect("the history table")..];
    let rows = history[..history.find("</table>").unwrap()].matches("<tr data-id=").count();
    assert!(rows >= 6, "{rows} rows of checkpoint history: {history}");
    assert!(history.contains("<td>aligned</td>") && history.contains("<td>unaligned</td>"), "{history}");
    assert!(dom.contains("class=\"aligned\"") && dom.contains("class=\"unaligned\""), "the duration bars: {dom}");
    assert!(dom.contains("<span id=\"error\"></span>"), "the page reached the job: {dom}");
    // Flink's checkpoint overview: counts, and the latest completed, failed, restored and
    // savepoint.
    let part = |id: &str| {
        let from = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no {id} in {dom}"));
        dom[from..from + dom[from..].find("</table>").unwrap()].to_string()
    };
    let overview = part("overview");
    assert!(overview.contains("<td>counts</td>") && overview.contains(" completed, 0 failed</td>"), "{overview}");
    assert!(overview.contains(" triggered, ") && overview.contains(" in progress, "), "{overview}");
    assert!(overview.contains("<td>latest completed</td>") && overview.contains("state bytes ("), "{overview}");
    assert!(overview.contains("<td>latest failed</td>") && overview.contains("<td>latest restored</td>"), "{overview}");
    assert!(overview.contains("<td>latest savepoint</td>"), "{overview}");
    // The summary: min, average, max and percentiles of each figure.
    let summary = part("summary");
    assert!(summary.contains("<td>end-to-end duration</td>") && summary.matches(" ms</td>").count() >= 8, "{summary}");
    assert!(summary.contains("<th>p99.9</th>") && summary.contains("<td>state bytes</td>"), "{summary}");
    // The configuration in force.
    let config = part("config");
    assert!(config.contains("<td>interval-ms</td><td>100</td>") && config.contains("<td>mode</td>"), "{config}");
    // The history with trigger times; the count is the job's, not the kept history's.
    assert!(history.contains("<th>triggered</th>") && history.contains(" s</td>"), "{history}");
    let completed = dom.split("id=\"completed\">").nth(1).and_then(|s| s.split(' ').next()).unwrap_or("");
    let completed: u64 = completed.replace(',', "").parse().unwrap_or_else(|_| panic!("{completed}: {dom}"));
    assert!(completed >= 6, "{completed} completed");
    // Charts with axis labels; wide tables scroll in their box rather than wrap.
    assert!(dom.contains("records/s</text>") && dom.contains("time since the job started (s)"), "{dom}");
    assert!(dom.contains("duration (ms)</text>") && dom.contains("checkpoint id: "), "{dom}");
    assert!(dom.contains("<div class=\"wide\"><table id=\"tasks\">"), "{dom}");
    // The newest checkpoint selected: its tasks, each with its own figures.
    let tasks = &dom[dom.find("id=\"tasks\"").expect("the tasks table")..];
    let tasks = &tasks[..tasks.find("</table>").unwrap()];
    let task_rows = tasks.matches("<tr>").count() - 1;
    assert!(task_rows >= 2 && tasks.contains("<td>written</td>") && tasks.contains(" ms</td>"), "{tasks}");
    // Rendered: a PNG of the window's size, far from blank (a blank page compresses to a few KB).
    let shot = std::env::temp_dir().join(format!("weir-dashboard-{}.png", std::process::id()));
    let taken = browse(&browser, &url, &format!("--screenshot={}", shot.display()));
    assert!(taken.status.success(), "{}", String::from_utf8_lossy(&taken.stderr));
    let png = std::fs::read(&shot).unwrap();
    let _ = std::fs::remove_file(&shot);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) =
        (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
    assert_eq!((w, h), (1000, 1400));
    assert!(png.len() > 50_000, "a screenshot of {} bytes: a blank page?", png.len());
    let (ok, text) = control(&addr, &["stop", std::env::temp_dir().join("weir-dashboard-sp").to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(job.child.wait().unwrap().success());
}
