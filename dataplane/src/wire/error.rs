//! Why bytes were refused.

/// Why bytes were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the header or the header's length says.
    Truncated,
    /// Bytes after the end of the message.
    TrailingBytes,
    /// Wrong magic number.
    BadMagic,
    /// Unsupported version.
    BadVersion(u16),
    /// Unknown message kind.
    UnknownKind(u16),
    /// Body length wrong for the kind, or over [`MAX_MESSAGE_LEN`].
    BadLength,
    /// Entry count over its bound or inconsistent with the length.
    BadCount,
    /// A field holds a value outside its enumeration.
    BadValue(&'static str),
    /// A reserved field is not zero.
    ReservedNotZero,
    /// The caller's buffer is too small for the encoded message.
    BufferTooSmall,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for WireError {}
