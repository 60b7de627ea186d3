//! Checkpoints in an object store, one binary: the engine over an in-memory store and this
//! crate's S3 client against a real S3 server (moto; see `weir_testkit::s3`). The command's
//! object-store tests are `weir-cli`'s.

/// The helpers every package's tests share.
mod common {
    pub(crate) use weir_testkit::*;
}

mod object_store;
