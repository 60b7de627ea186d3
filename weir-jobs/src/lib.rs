//! The jobs the `weir` command runs, written against `weir`'s public API as any user's jobs
//! are, as library functions so that the tests and the benchmarks run exactly what users run:
//!
//! - [`wordcount`]: the default job (generator → key_by → window count) and word count.
//! - [`nexmark`]: the Nexmark benchmark's generator and queries, with sequential references.
//! - [`bench`](mod@bench): the benchmark workloads `weir bench` and perf/ run, and their report.
//! - [`simulated`]: the jobs `weir simulate` checks from seeds.
//! - [`zipf`]: keys drawn with Zipf's law (the benchmarks' `--zipf`).
//!
//! ## Modules, lowest layer first (a module uses only modules above it in this list)
//!
//! - `zipf`: arithmetic.
//! - `nexmark`, `simulated`, `wordcount`: the jobs, which never use each other.
//! - `bench`: the benchmark workloads (it runs the default job of `wordcount`).
//!
//! May touch: `weir`.

pub mod bench;
pub mod nexmark;
pub mod simulated;
pub mod wordcount;
pub mod zipf;
