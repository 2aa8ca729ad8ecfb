//! The cluster's join token and the challenge-response that proves a peer
//! holds it (see `docs/operations.md`, "The join token").
//!
//! The scheduler sends every new link a random nonce ([`wire::Challenge`]);
//! the peer answers with its [`wire::Join`], whose `mac` is
//! HMAC-SHA256(token, [`MAC_DOMAIN`] || nonce || wire version || the Join's
//! bytes before `mac`). The scheduler recomputes it and compares in
//! constant time. The token itself never crosses the wire, and a recorded
//! answer is worthless for the next link (another nonce).
//!
//! The token comes from a file (`--join-token-file PATH`) or the
//! environment ([`TOKEN_ENV`]), never from the command line, where any
//! user of the host could read it in the process list.

use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::wire::{self, Join, NONCE_LEN};

/// The environment variable a daemon reads its join token from (when no
/// `--join-token-file` is given).
pub const TOKEN_ENV: &str = "SYMPHONY_JOIN_TOKEN";
/// Shortest token accepted, bytes: shorter ones are a configuration
/// mistake (guessable).
pub const MIN_TOKEN_LEN: usize = 16;
/// Prefix of every MAC input: a MAC made for another purpose with the same
/// token never verifies here.
pub const MAC_DOMAIN: &[u8] = b"symphony-join\0";
/// The [`JoinToken::for_purpose`] label of the data links between a
/// backend and a frontend.
pub const DATA_LINK_LABEL: &[u8] = b"symphony-data-link";
/// Bytes of the Join covered by the MAC: everything before `mac`.
const JOIN_SIGNED_LEN: usize = std::mem::size_of::<Join>() - wire::MAC_LEN;

type HmacSha256 = Hmac<Sha256>;

/// Why no usable join token could be had.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Shorter than [`MIN_TOKEN_LEN`] once trimmed.
    #[error("the join token has {0} bytes; at least {MIN_TOKEN_LEN} are needed")]
    TooShort(usize),
    /// The token file cannot be read.
    #[error("cannot read the join token file {}: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token file holds an unusable token.
    #[error("{}: {source}", file.display())]
    BadFile {
        /// The file.
        file: PathBuf,
        /// What is wrong with its token.
        source: Box<JoinError>,
    },
    /// [`TOKEN_ENV`] holds an unusable token.
    #[error("{TOKEN_ENV}: {0}")]
    BadEnv(Box<JoinError>),
    /// The OS random generator failed.
    #[error("no OS randomness for a join token: {0}")]
    NoRandomness(getrandom::Error),
}


/// A cluster's shared secret. Its `Debug` output never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken(Vec<u8>);

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinToken(<{} bytes>)", self.0.len())
    }
}

impl JoinToken {
    /// A token of `bytes` with surrounding ASCII whitespace removed (a
    /// file's trailing newline is not part of it); at least
    /// [`MIN_TOKEN_LEN`] bytes.
    pub fn new(bytes: &[u8]) -> Result<JoinToken, JoinError> {
        let t = bytes.trim_ascii();
        if t.len() < MIN_TOKEN_LEN {
            return Err(JoinError::TooShort(t.len()));
        }
        Ok(JoinToken(t.to_vec()))
    }

    /// A fresh random token: 32 bytes of the OS generator as 64 hex
    /// digits (printable, so it can travel in the environment).
    pub fn generate() -> Result<JoinToken, JoinError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(JoinError::NoRandomness)?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(JoinToken(hex.into_bytes()))
    }

    /// The token's text, for handing it to a child process's environment
    /// (`None` if it is not UTF-8).
    pub fn as_text(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The token a daemon uses: the file's content if `file` is given (an
    /// unreadable or too short file is an error), else [`TOKEN_ENV`] if
    /// set and not empty, else none.
    pub fn from_file_or_env(file: Option<&Path>) -> Result<Option<JoinToken>, JoinError> {
        if let Some(p) = file {
            let bytes = std::fs::read(p).map_err(|source| JoinError::Read {
                file: p.to_path_buf(),
                source,
            })?;
            return JoinToken::new(&bytes).map(Some).map_err(|e| JoinError::BadFile {
                file: p.to_path_buf(),
                source: Box::new(e),
            });
        }
        match std::env::var_os(TOKEN_ENV) {
            Some(v) if !v.is_empty() => JoinToken::new(v.as_encoded_bytes())
                .map(Some)
                .map_err(|e| JoinError::BadEnv(Box::new(e))),
            _ => Ok(None),
        }
    }

    fn keyed(&self) -> HmacSha256 {
        // HMAC takes keys of any length: this cannot fail.
        let Ok(mac) = HmacSha256::new_from_slice(&self.0) else {
            unreachable!("HMAC accepts any key length")
        };
        mac
    }

    fn mac_over(&self, nonce: &[u8; NONCE_LEN], version: u16, join: &Join) -> HmacSha256 {
        let mut mac = self.keyed();
        mac.update(MAC_DOMAIN);
        mac.update(nonce);
        mac.update(&version.to_le_bytes());
        // The MAC covers the Join as sent: with the has-MAC flag set.
        let mut signed = *join;
        signed.flags |= wire::JOIN_HAS_MAC;
        mac.update(&bytemuck::bytes_of(&signed)[..JOIN_SIGNED_LEN]);
        mac
    }

    /// A 32-byte key for another use of the cluster's secret (heartbeats,
    /// ...): HMAC-SHA256 of `label` under the token. Distinct labels give
    /// independent keys, and none equals a Join MAC (those cover
    /// [`MAC_DOMAIN`] first).
    pub fn derive_key(&self, label: &[u8]) -> [u8; 32] {
        let mut mac = self.keyed();
        mac.update(label);
        mac.finalize().into_bytes().into()
    }

    /// The token proving membership for one purpose only (its key is
    /// [`derive_key`](Self::derive_key) of `label`): a Join signed with it
    /// never verifies under the cluster token itself nor under another
    /// label, so an answer obtained on one kind of link cannot be relayed
    /// to another.
    pub fn for_purpose(&self, label: &[u8]) -> JoinToken {
        JoinToken(self.derive_key(label).to_vec())
    }

    /// The MAC a peer puts in its `join` (every field but `mac` set) in
    /// answer to `nonce`, speaking wire `version`.
    pub fn sign(&self, nonce: &[u8; NONCE_LEN], version: u16, join: &Join) -> [u8; wire::MAC_LEN] {
        self.mac_over(nonce, version, join).finalize().into_bytes().into()
    }

    /// Whether `join.mac` answers `nonce` with this token (constant time).
    pub fn verify(&self, nonce: &[u8; NONCE_LEN], version: u16, join: &Join) -> bool {
        self.mac_over(nonce, version, join).verify_slice(&join.mac).is_ok()
    }
}

/// Where the scheduler's nonces come from: the OS generator in a daemon,
/// a seeded sequence in the deterministic harness (its runs must replay).
#[derive(Clone, Debug)]
pub enum NonceSource {
    /// `getrandom`.
    Os,
    /// A reproducible sequence (splitmix64 of the seed): tests only, never
    /// a daemon.
    Seeded(u64),
}

impl NonceSource {
    /// The next nonce; `None` if the OS generator failed.
    pub fn next_nonce(&mut self) -> Option<[u8; NONCE_LEN]> {
        let mut n = [0u8; NONCE_LEN];
        match self {
            NonceSource::Os => getrandom::fill(&mut n).ok()?,
            NonceSource::Seeded(state) => {
                for chunk in n.chunks_exact_mut(8) {
                    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = *state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
                }
            }
        }
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Role;

    #[test]
    fn derived_keys_depend_on_token_and_label_and_are_stable() {
        let token = JoinToken::new(b"correct horse battery staple").unwrap();
        let other = JoinToken::new(b"another sixteen-byte token").unwrap();
        let k = token.derive_key(b"heartbeat");
        assert_eq!(k, token.derive_key(b"heartbeat"));
        assert_ne!(k, token.derive_key(b"heartbeat2"));
        assert_ne!(k, other.derive_key(b"heartbeat"));
    }

    #[test]
    fn a_mac_verifies_only_with_its_token_nonce_version_and_fields() {
        let token = JoinToken::new(b"  correct horse battery staple\n").unwrap();
        let other = JoinToken::new(b"another sixteen-byte token").unwrap();
        let nonce = [7u8; NONCE_LEN];
        let j = Join::new(Role::Backend, 3, 2, "");
        let j = j.with_mac(token.sign(&nonce, wire::VERSION, &j));
        assert!(token.verify(&nonce, wire::VERSION, &j));
        assert!(!other.verify(&nonce, wire::VERSION, &j));
        assert!(!token.verify(&[8u8; NONCE_LEN], wire::VERSION, &j));
        assert!(!token.verify(&nonce, wire::VERSION + 1, &j));
        let mut renamed = j;
        renamed.id = 4;
        assert!(!token.verify(&nonce, wire::VERSION, &renamed));
    }

    #[test]
    fn a_purpose_token_answer_verifies_for_that_purpose_only() {
        let token = JoinToken::new(b"correct horse battery staple").unwrap();
        let data = token.for_purpose(DATA_LINK_LABEL);
        let nonce = [9u8; NONCE_LEN];
        let j = Join::new(Role::Backend, 3, 2, "");
        let on_data = j.with_mac(data.sign(&nonce, wire::VERSION, &j));
        assert!(data.verify(&nonce, wire::VERSION, &on_data));
        assert!(!token.verify(&nonce, wire::VERSION, &on_data), "not a scheduler-link answer");
        let on_sched = j.with_mac(token.sign(&nonce, wire::VERSION, &j));
        assert!(!data.verify(&nonce, wire::VERSION, &on_sched), "not a data-link answer");
        assert_eq!(format!("{data:?}"), "JoinToken(<32 bytes>)");
    }

    #[test]
    fn tokens_are_trimmed_checked_and_never_printed() {
        assert!(JoinToken::new(b"short").unwrap_err().to_string().contains("at least 16"));
        let t = JoinToken::generate().unwrap();
        assert_eq!(t.as_text().unwrap().len(), 64);
        assert_ne!(t, JoinToken::generate().unwrap());
        assert_eq!(format!("{t:?}"), "JoinToken(<64 bytes>)");
        let dir = std::env::temp_dir().join(format!("symphony-join-test-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789abcdef0123\n").unwrap();
        let from_file = JoinToken::from_file_or_env(Some(&dir)).unwrap().unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(from_file.as_text(), Some("0123456789abcdef0123"));
        assert!(JoinToken::from_file_or_env(Some(&dir)).unwrap_err().to_string().contains("cannot read"));
    }

    #[test]
    fn seeded_nonces_replay_and_differ_between_draws() {
        let (mut a, mut b) = (NonceSource::Seeded(1), NonceSource::Seeded(1));
        let first = a.next_nonce().unwrap();
        assert_eq!(first, b.next_nonce().unwrap());
        assert_ne!(first, a.next_nonce().unwrap());
        assert_ne!(NonceSource::Os.next_nonce(), NonceSource::Os.next_nonce());
    }
}
