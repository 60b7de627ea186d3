//! Kafka's failures as weir's errors: a broker that cannot be reached or answers nonsense is
//! I/O (retryable: the job fails over and tries again), a producer fenced by a newer one is
//! [`weir::Error::Fenced`] (never retried: another process owns the output), a missing topic or
//! an unsupported broker is configuration.
//!
//! May touch: nothing else in the crate.

use kafka_protocol::error::ResponseError;
use weir::Error;

/// A network failure talking to a broker: retryable.
pub(crate) fn network(context: String, source: std::io::Error) -> Error {
    Error::Io { context, path: None, source }
}

/// A broker's error code `code` in its answer to `api`, from `broker`.
pub(crate) fn protocol(broker: &str, api: &str, code: i16) -> Error {
    let e = ResponseError::try_from_code(code).unwrap_or(ResponseError::Unknown(code));
    let what = format!("Kafka broker {broker} refused {api}: {e:?} (error {code})");
    match e {
        ResponseError::ProducerFenced
        | ResponseError::InvalidProducerEpoch
        | ResponseError::TransactionalIdNotFound => Error::Fenced(format!(
            "{what}: a newer producer with the same transactional id took over (another process of this job \
                 writes this output now, or another job uses the same transactional-id prefix: give each its own)"
        )),
        ResponseError::TopicAuthorizationFailed
        | ResponseError::ClusterAuthorizationFailed
        | ResponseError::TransactionalIdAuthorizationFailed
        | ResponseError::UnsupportedVersion
        | ResponseError::InvalidTopicException
        | ResponseError::MessageTooLarge => Error::config(what),
        _ => network(what, std::io::Error::other(format!("{e}"))),
    }
}

/// Whether broker error `code` means "not yet, ask again" (a coordinator loading, a
/// transaction still completing), worth a few quick retries before the job fails over.
pub(crate) fn transient(code: i16) -> bool {
    matches!(
        ResponseError::try_from_code(code),
        Some(
            ResponseError::CoordinatorLoadInProgress
                | ResponseError::CoordinatorNotAvailable
                | ResponseError::NotCoordinator
                | ResponseError::ConcurrentTransactions
                | ResponseError::LeaderNotAvailable
                | ResponseError::NotLeaderOrFollower
                | ResponseError::RequestTimedOut
        )
    )
}
