//! The `weir` executable: jemalloc as the allocator, then the command ([`weir_cli::main`]).

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // A closed pipe ends the command quietly, as `yes | head` does: Rust ignores SIGPIPE, so
    // `weir bench … | head` made the next print panic.
    #[cfg(unix)]
    // SAFETY: called first thing, before any other thread exists, setting a signal's
    // disposition to the default; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    weir_cli::main()
}
