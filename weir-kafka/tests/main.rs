//! The Kafka connector's integration tests, one binary, against a real Kafka-protocol broker
//! (Tansu; see `weir_testkit::kafka`). The command's Kafka tests are `weir-cli`'s.

/// The helpers every package's tests share.
mod common {
    pub(crate) use weir_testkit::*;
}

mod kafka;
mod security;
