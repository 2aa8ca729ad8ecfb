//! The plane's output: encoded messages waiting to be sent, each with the
//! peer it goes to. The host drains it after every input.

use dataplane::wire;

/// A peer of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerId {
    /// Frontend by id.
    Frontend(u32),
    /// Backend by id.
    Backend(u32),
}

/// Encoded messages waiting to be sent, in order, in one flat buffer
/// (no allocation once warm). Each message is encoded into a scratch
/// buffer of the largest message size and only its bytes are appended, so
/// a 40-byte `Dropped` costs 40 bytes of copying, not a 32 KiB fill.
#[derive(Debug, Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    items: Vec<(PeerId, usize, usize)>,
    scratch: Vec<u8>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Outbox {
            bytes: Vec::with_capacity(1 << 20),
            items: Vec::with_capacity(4096),
            scratch: vec![0; wire::MAX_MESSAGE_LEN],
        }
    }
    /// The messages, in order.
    pub fn iter(&self) -> impl Iterator<Item = (PeerId, &[u8])> {
        self.items
            .iter()
            .map(|&(p, at, n)| (p, &self.bytes[at..at + n]))
    }
    /// Number of messages.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// The newest message to `to` of `kind`, to change in place (the
    /// node signs a Welcome there, knowing the handshake's nonces).
    pub fn newest_mut(&mut self, to: PeerId, kind: wire::Kind) -> Option<&mut [u8]> {
        let bytes = &mut self.bytes;
        let &(_, at, n) = self.items.iter().rev().find(|&&(p, at, n)| {
            p == to && n >= wire::HEADER_LEN && bytes[at + 6..at + 8] == (kind as u16).to_le_bytes()
        })?;
        Some(&mut self.bytes[at..at + n])
    }
    /// Forgets every message, keeping the storage.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }
    /// Appends a message produced by `encode` (which writes into the given
    /// buffer and returns the length); one that fails to encode is skipped.
    pub(super) fn push(
        &mut self,
        to: PeerId,
        encode: impl FnOnce(&mut [u8]) -> Result<usize, wire::WireError>,
    ) {
        if self.scratch.len() < wire::MAX_MESSAGE_LEN {
            self.scratch.resize(wire::MAX_MESSAGE_LEN, 0);
        }
        if let Ok(n) = encode(&mut self.scratch) {
            let at = self.bytes.len();
            self.bytes.extend_from_slice(&self.scratch[..n]);
            self.items.push((to, at, n));
        }
    }
}
