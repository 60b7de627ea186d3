//! Word count over a file or folder: a running count per word, printed as the ten most
//! frequent words.
//!
//! `cargo run --release --example wordcount -- PATH`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); an example is a program, which may read the wall clock and start threads

use weir::source::TextSource;
use weir::{Job, RunConfig, Word};

fn main() -> weir::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "README.md".into());
    let job = Job::new("wordcount-example").with_parallelism(2);
    let counts = job
        .text(TextSource::open(&path)?)
        .words()
        .key_by(|w: &Word| w.clone())
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |w: &Word, c: &u64| (w.clone(), *c))
        .collect();
    job.execute(RunConfig::default())?;
    // The running counts' maximum per word is its total.
    let mut totals = std::collections::HashMap::new();
    for (w, c) in std::mem::take(&mut *counts.lock().expect("collector")) {
        let t = totals.entry(w).or_insert(0);
        *t = c.max(*t);
    }
    let mut top: Vec<_> = totals.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.as_str().cmp(&b.0.as_str())));
    for (w, c) in top.iter().take(10) {
        println!("{c:>8}  {w}");
    }
    Ok(())
}
