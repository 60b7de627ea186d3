//! Small helpers shared by the perf/ harnesses.

/// Today's date as `YYYY-MM-DD` (from `date`), or `undated`: the folder results go to.
pub fn today() -> String {
    std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "undated".into())
}
