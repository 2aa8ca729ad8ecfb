//! One error type for the whole tool: what went wrong, and the exit code it
//! ends the process with (usage errors 2, everything else 1).

use std::path::PathBuf;

/// Exit code of runtime failures (unreachable peer, timeout, bad data).
pub const EXIT_RUNTIME: i32 = 1;
/// Exit code of bad arguments (what clap also uses for usage errors).
pub const EXIT_USAGE: i32 = 2;

/// A failure, with its operator-facing message.
#[derive(Debug, thiserror::Error)]
pub enum Fail {
    /// Bad arguments, in words an operator can act on.
    #[error("{0}")]
    Usage(String),
    /// A runtime failure (peer, timing, data), in words an operator can act on.
    #[error("{0}")]
    Runtime(String),
    /// A failure with what was being done when it happened.
    #[error("{context}: {source}")]
    Context {
        /// What was being done (e.g. `peer 10.0.0.1:7000`).
        context: String,
        /// The failure.
        source: Box<Fail>,
    },
    /// A transport call failed.
    #[error(transparent)]
    Transport(#[from] dataplane::transport::Error),
    /// A memory registration or access failed.
    #[error(transparent)]
    Memory(#[from] dataplane::mem::MemError),
    /// An OS call failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A message did not decode.
    #[error("wire: {0}")]
    Wire(#[from] dataplane::wire::WireError),
    /// A runtime failure caused by another error, which it keeps as its
    /// source: what was being done, then the error's text.
    #[error("{what}: {source}")]
    Caused {
        /// What was being done (e.g. `cannot start server 2`).
        what: String,
        /// The error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A report could not be encoded.
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl Fail {
    /// A runtime failure.
    pub fn runtime(msg: impl Into<String>) -> Self {
        Fail::Runtime(msg.into())
    }
    /// A bad-argument failure.
    pub fn usage(msg: impl Into<String>) -> Self {
        Fail::Usage(msg.into())
    }
    /// Prefixes the message with context.
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        Fail::Context { context: what.to_string(), source: Box::new(self) }
    }
    /// `Write` of `path`.
    pub fn write(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Fail {
        let path = path.into();
        move |source| Fail::Write { path, source }
    }
    /// `Caused` by an error while doing `what`.
    pub fn caused<E: std::error::Error + Send + Sync + 'static>(what: impl Into<String>) -> impl FnOnce(E) -> Fail {
        let what = what.into();
        move |source| Fail::Caused { what, source: Box::new(source) }
    }
    /// `Read` of `path`.
    pub fn read(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Fail {
        let path = path.into();
        move |source| Fail::Read { path, source }
    }
    /// The process exit code.
    pub fn code(&self) -> i32 {
        match self {
            Fail::Usage(_) => EXIT_USAGE,
            Fail::Context { source, .. } => source.code(),
            _ => EXIT_RUNTIME,
        }
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
