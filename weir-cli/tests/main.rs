//! The `weir` command's integration tests, one binary, a module per concern: each runs the
//! command as a user does (`CARGO_BIN_EXE_weir`), built with the engine's failure points and
//! the command's hidden crash flags (`testing`).

/// The helpers every package's tests share, and the command's word count.
mod common {
    use std::path::Path;
    use std::process::Command;

    pub(crate) use weir_testkit::*;

    /// `weir wordcount` on 2 workers with checkpoints into `chk`, with `args` (settings, then
    /// anything else), its output captured.
    pub(crate) fn wordcount(input: &Path, out: &Path, chk: &Path, args: &[&str]) -> Command {
        wordcount_command(env!("CARGO_BIN_EXE_weir"), input, out, chk, args)
    }
}

mod checkpoint_dirs;
mod cli;
mod control;
mod crash;
mod dashboard;
mod integrity;
mod kafka;
mod object_store;
mod operating;
mod prometheus;
