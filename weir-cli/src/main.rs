//! The `weir` executable: jemalloc as the allocator, then the command ([`weir_cli::main`]).

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    weir_cli::main()
}
