//! weir-ops' integration tests, one binary: a program that depends on `weir` and `weir-ops`
//! alone operates its own job (no command, no process-wide handler).

mod embedder;
