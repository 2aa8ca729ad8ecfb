//! The errors every node daemon's start-up shares: a part that cannot be
//! set up, and a scheduler that cannot be reached. A role's error enum
//! wraps them (`#[error(transparent)]`), so the message and the source
//! chain are the same in every role.

/// Why a part of a daemon could not be set up: what, and the error that
/// said so.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SetupError {
    /// The part, as the operator knows it ("staging region", "wait set").
    pub what: String,
    /// Why.
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl SetupError {
    /// `what` cannot be set up because of `source` (an error, or a message).
    pub fn new(what: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> SetupError {
        SetupError {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// For `map_err`: an error of setting up `what` (`?` turns it into the
/// role's own error type, which wraps [`SetupError`]).
pub fn setup<E>(what: impl Into<String>) -> impl FnOnce(E) -> SetupError
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let what = what.into();
    move |e| SetupError::new(what, e)
}

/// The scheduler a node registers with cannot be reached.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the scheduler at '{addr}': {source}")]
pub struct SchedulerUnreachable {
    /// Its address (or addresses, comma-separated).
    pub addr: String,
    /// Why.
    pub source: dataplane::transport::Error,
}
