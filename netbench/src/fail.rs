//! One error type for the whole tool: a message for the operator and the
//! exit code it ends the process with.

use std::fmt;

/// Exit code of runtime failures (unreachable peer, timeout, bad data).
pub const EXIT_RUNTIME: i32 = 1;
/// Exit code of bad arguments (what clap also uses for usage errors).
pub const EXIT_USAGE: i32 = 2;

/// A failure with its operator-facing message.
#[derive(Debug)]
pub struct Fail {
    /// What went wrong, in words an operator can act on.
    pub msg: String,
    /// Process exit code.
    pub code: i32,
}

impl Fail {
    /// A runtime failure.
    pub fn runtime(msg: impl Into<String>) -> Self {
        Fail {
            msg: msg.into(),
            code: EXIT_RUNTIME,
        }
    }
    /// A bad-argument failure.
    pub fn usage(msg: impl Into<String>) -> Self {
        Fail {
            msg: msg.into(),
            code: EXIT_USAGE,
        }
    }
    /// Prefixes the message with context.
    pub fn context(self, what: impl fmt::Display) -> Self {
        Fail {
            msg: format!("{what}: {}", self.msg),
            code: self.code,
        }
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<dataplane::transport::Error> for Fail {
    fn from(e: dataplane::transport::Error) -> Self {
        Fail::runtime(e.to_string())
    }
}

impl From<dataplane::mem::MemError> for Fail {
    fn from(e: dataplane::mem::MemError) -> Self {
        Fail::runtime(e.to_string())
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Self {
        Fail::runtime(e.to_string())
    }
}

impl From<dataplane::wire::WireError> for Fail {
    fn from(e: dataplane::wire::WireError) -> Self {
        Fail::runtime(format!("wire: {e}"))
    }
}

/// `Result` with [`Fail`].
pub type Res<T> = Result<T, Fail>;

/// Early return with a runtime failure built like `format!`.
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::fail::Fail::runtime(format!($($t)*))) };
}

/// Early return with a usage failure built like `format!`.
#[macro_export]
macro_rules! bail_usage {
    ($($t:tt)*) => { return Err($crate::fail::Fail::usage(format!($($t)*))) };
}
