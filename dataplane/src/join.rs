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
//! The scheduler proves the token back: the peer's Join carries a fresh
//! nonce of the peer's, and the [`wire::Welcome`]'s `mac` is
//! HMAC-SHA256(the token's welcome key, [`WELCOME_DOMAIN`] || challenge
//! nonce || wire version || the Join's bytes before `mac` || the Welcome's
//! bytes before `mac`) ([`JoinToken::sign_welcome`]). A peer holding a
//! token takes nothing (epoch, models, plans) from a scheduler whose
//! Welcome does not verify: a process that took the scheduler's address
//! cannot make one, nor replay one recorded for another Join.
//!
//! The token comes from a file (`--join-token-file PATH`) or the
//! environment ([`TOKEN_ENV`]), never from the command line, where any
//! user of the host could read it in the process list.

use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::wire::{self, Join, Welcome, NONCE_LEN};

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
/// The [`JoinToken::derive_key`] label of the key that signs Welcomes: a
/// Join MAC (made with the token itself) never verifies as a Welcome's.
pub const WELCOME_LABEL: &[u8] = b"symphony scheduler welcome v1";
/// Prefix of every Welcome MAC's input.
pub const WELCOME_DOMAIN: &[u8] = b"symphony-welcome\0";
/// Bytes of the Join covered by the MAC: everything before `mac`.
const JOIN_SIGNED_LEN: usize = std::mem::size_of::<Join>() - wire::MAC_LEN;
/// Bytes of the Welcome covered by its MAC: everything before `mac`.
const WELCOME_SIGNED_LEN: usize = std::mem::size_of::<Welcome>() - wire::MAC_LEN;

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

    fn welcome_mac_over(&self, nonce: &[u8; NONCE_LEN], join: &Join, welcome: &Welcome) -> HmacSha256 {
        let key = self.derive_key(WELCOME_LABEL);
        let Ok(mut mac) = HmacSha256::new_from_slice(&key) else {
            unreachable!("HMAC accepts any key length")
        };
        mac.update(WELCOME_DOMAIN);
        mac.update(nonce);
        mac.update(&wire::VERSION.to_le_bytes());
        mac.update(&bytemuck::bytes_of(join)[..JOIN_SIGNED_LEN]);
        mac.update(&bytemuck::bytes_of(welcome)[..WELCOME_SIGNED_LEN]);
        mac
    }

    /// The MAC the scheduler puts in `welcome` (every field but `mac` set)
    /// in answer to `join`, which answered the challenge of `nonce`: it
    /// covers the peer's nonce, role and id, so it answers that Join only.
    pub fn sign_welcome(&self, nonce: &[u8; NONCE_LEN], join: &Join, welcome: &Welcome) -> [u8; wire::MAC_LEN] {
        self.welcome_mac_over(nonce, join, welcome).finalize().into_bytes().into()
    }

    /// Whether `welcome.mac` is this token's answer to `join` after the
    /// challenge of `nonce` (constant time).
    pub fn verify_welcome(&self, nonce: &[u8; NONCE_LEN], join: &Join, welcome: &Welcome) -> bool {
        self.welcome_mac_over(nonce, join, welcome).verify_slice(&welcome.mac).is_ok()
    }
}

/// A handshake's nonces: the scheduler's challenge, then the peer's own
/// (zero without a token), which the Welcome's MAC must cover.
pub type HandshakeNonces = ([u8; NONCE_LEN], [u8; NONCE_LEN]);

/// A peer's (frontend's or backend's) side of the mutual proof with a
/// scheduler: its token (none: open membership, nothing signed or
/// checked), where its Join nonces come from, and how many Welcomes it
/// refused for not proving the token.
#[derive(Clone, Debug)]
pub struct PeerProof {
    token: Option<JoinToken>,
    nonces: NonceSource,
    forged: u64,
}

impl PeerProof {
    /// The proof of a peer holding `token`, its nonces from the OS.
    pub fn new(token: Option<JoinToken>) -> Self {
        PeerProof { token, nonces: NonceSource::Os, forged: 0 }
    }

    /// It proves `token` from now on (none: nothing signed or checked).
    pub fn set_token(&mut self, token: Option<JoinToken>) {
        self.token = token;
    }

    /// Its Join nonces come from `nonces` (a deterministic harness seeds
    /// them; a daemon keeps the OS generator).
    pub fn set_nonces(&mut self, nonces: NonceSource) {
        self.nonces = nonces;
    }

    /// The token it proves, if any.
    pub fn token(&self) -> Option<&JoinToken> {
        self.token.as_ref()
    }

    /// The nonces of a handshake whose challenge carried `theirs`: ours is
    /// fresh with a token, zero without; `None` if the OS has no
    /// randomness.
    pub fn nonces(&mut self, theirs: [u8; NONCE_LEN]) -> Option<HandshakeNonces> {
        let ours = match self.token {
            Some(_) => self.nonces.next_nonce()?,
            None => [0; NONCE_LEN],
        };
        Some((theirs, ours))
    }

    /// `join` (every field but nonce and MAC set) as sent in answer to the
    /// challenge of `nonces`: with our nonce and the MAC if we hold a
    /// token, as is otherwise. The same for the same arguments, so the
    /// Welcome is checked against exactly what was sent.
    pub fn sign(&self, join: Join, (theirs, ours): &HandshakeNonces) -> Join {
        match &self.token {
            Some(t) => {
                let j = join.with_nonce(*ours);
                j.with_mac(t.sign(theirs, wire::VERSION, &j))
            }
            None => join,
        }
    }

    /// Whether `welcome` answers our `join` (as [`sign`](Self::sign)
    /// made it) after the challenge of `nonces` with the token: always
    /// without one. A Welcome that does not is counted.
    pub fn check_welcome(&mut self, nonces: &HandshakeNonces, join: &Join, welcome: &Welcome) -> bool {
        let proven = self.token.as_ref().is_none_or(|t| t.verify_welcome(&nonces.0, join, welcome));
        self.forged += u64::from(!proven);
        proven
    }

    /// How many Welcomes did not prove the token.
    pub fn forged_welcomes(&self) -> u64 {
        self.forged
    }
}

/// Checking a peer's or the scheduler's proof over any bytes never panics,
/// and no bytes pass for the fuzz token's MAC but the MAC itself: for
/// fuzzers and property tests, next to `wire::fuzz_decode`.
pub fn fuzz_proofs(data: &[u8]) {
    let Ok(token) = JoinToken::new(b"symphony wire fuzz token") else {
        unreachable!("the fuzz token is long enough")
    };
    let nonce = [0u8; NONCE_LEN];
    let (join, welcome) = match wire::decode(data) {
        Ok(wire::Message::Join(j)) => (j, Welcome::new(1, 0, 0)),
        Ok(wire::Message::Welcome(w)) => (Join::new(wire::Role::Backend, 1, 1, ""), w),
        _ => return,
    };
    assert!(!token.verify(&nonce, wire::VERSION, &join) || join.mac == token.sign(&nonce, wire::VERSION, &join));
    let forged = token.verify_welcome(&nonce, &join, &welcome);
    assert!(!forged || welcome.mac == token.sign_welcome(&nonce, &join, &welcome));
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
    use crate::wire::{decode, encode, Message, Role, MAC_LEN, MAX_MESSAGE_LEN};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(55), ..ProptestConfig::default() })]

        /// Joins and Welcomes of any field values round-trip; a Join with
        /// nonce or MAC bytes but no MAC flag is refused; any bit of a
        /// signed Welcome or of its Join changed, and it no longer
        /// verifies.
        #[test]
        fn handshake_proofs_round_trip_and_any_change_breaks_them(
            id in any::<u32>(), count in any::<u32>(), epoch in any::<u32>(), models in any::<u32>(),
            delay in any::<u64>(), peer_nonce in any::<[u8; NONCE_LEN]>(), nonce in any::<[u8; NONCE_LEN]>(),
            flip in 0usize..(std::mem::size_of::<Join>() + std::mem::size_of::<Welcome>() - 2 * MAC_LEN), bit in 0u8..8,
        ) {
            let token = JoinToken::new(b"symphony wire property token").unwrap();
            let j = Join::new(Role::Backend, id, count, "").with_nonce(peer_nonce);
            let j = j.with_mac(token.sign(&nonce, wire::VERSION, &j));
            let w = Welcome::new(models, epoch, delay);
            let w = Welcome { mac: token.sign_welcome(&nonce, &j, &w), ..w };
            let mut buf = [0u8; MAX_MESSAGE_LEN];
            let n = encode(&mut buf, &j).unwrap();
            prop_assert_eq!(decode(&buf[..n]), Ok(Message::Join(j)));
            wire::fuzz_decode(&buf[..n]);
            fuzz_proofs(&buf[..n]);
            let n = encode(&mut buf, &w).unwrap();
            prop_assert_eq!(decode(&buf[..n]), Ok(Message::Welcome(w)));
            wire::fuzz_decode(&buf[..n]);
            fuzz_proofs(&buf[..n]);
            prop_assert!(token.verify_welcome(&nonce, &j, &w));
            // One bit of the signed bytes (the Join's, then the Welcome's).
            let (mut j2, mut w2) = (j, w);
            let join_signed = std::mem::size_of::<Join>() - MAC_LEN;
            if flip < join_signed {
                bytemuck::bytes_of_mut(&mut j2)[flip] ^= 1 << bit;
            } else {
                bytemuck::bytes_of_mut(&mut w2)[flip - join_signed] ^= 1 << bit;
            }
            prop_assert!(!token.verify_welcome(&nonce, &j2, &w2));
            // Without the MAC flag, no nonce or MAC bytes.
            let bare = Join { flags: 0, mac: [0; MAC_LEN], ..j };
            let n = encode(&mut buf, &bare).unwrap();
            prop_assert_eq!(decode(&buf[..n]).is_err(), bare.nonce != [0; NONCE_LEN]);
        }
    }

    #[test]
    fn a_peer_proof_signs_with_a_fresh_nonce_and_counts_welcomes_that_do_not_prove_the_token() {
        let token = JoinToken::new(b"correct horse battery staple").unwrap();
        let mut proof = PeerProof::new(Some(token.clone()));
        proof.set_nonces(NonceSource::Seeded(3));
        let (a, b) = (proof.nonces([1; NONCE_LEN]).unwrap(), proof.nonces([1; NONCE_LEN]).unwrap());
        assert_ne!(a.1, b.1, "a fresh nonce of ours per handshake");
        let j = proof.sign(Join::new(Role::Frontend, 2, 0, "fe"), &a);
        assert!(token.verify(&a.0, wire::VERSION, &j) && j.nonce == a.1);
        assert_eq!(proof.sign(Join::new(Role::Frontend, 2, 0, "fe"), &a), j, "the same Join again");
        let w = Welcome::new(1, 9, 0);
        let signed = Welcome { mac: token.sign_welcome(&a.0, &j, &w), ..w };
        assert!(proof.check_welcome(&a, &j, &signed));
        assert!(!proof.check_welcome(&a, &j, &w), "unsigned");
        let other = proof.sign(Join::new(Role::Frontend, 2, 0, "fe"), &b);
        assert!(!proof.check_welcome(&b, &other, &signed), "a replay for another handshake");
        assert_eq!(proof.forged_welcomes(), 2);
        // Open membership: nothing signed, every Welcome taken.
        let mut open = PeerProof::new(None);
        let n = open.nonces([1; NONCE_LEN]).unwrap();
        assert_eq!(n.1, [0; NONCE_LEN]);
        let bare = open.sign(Join::new(Role::Backend, 1, 1, ""), &n);
        assert!(!bare.has_mac() && open.check_welcome(&n, &bare, &w) && open.forged_welcomes() == 0);
    }

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
    fn a_welcome_verifies_only_for_its_join_challenge_token_and_fields() {
        let token = JoinToken::new(b"correct horse battery staple").unwrap();
        let other = JoinToken::new(b"another sixteen-byte token").unwrap();
        let nonce = [7u8; NONCE_LEN];
        let j = Join::new(Role::Backend, 3, 2, "").with_nonce([5u8; NONCE_LEN]);
        let j = j.with_mac(token.sign(&nonce, wire::VERSION, &j));
        let w = Welcome::new(1, 4, 1_000);
        let w = Welcome { mac: token.sign_welcome(&nonce, &j, &w), ..w };
        assert!(token.verify_welcome(&nonce, &j, &w));
        assert!(!other.verify_welcome(&nonce, &j, &w), "another token");
        assert!(!token.verify_welcome(&[8u8; NONCE_LEN], &j, &w), "another challenge");
        assert!(!token.verify_welcome(&nonce, &j.with_nonce([6u8; NONCE_LEN]), &w), "another peer nonce: a replay");
        assert!(!token.verify_welcome(&nonce, &Join { id: 4, ..j }, &w), "another peer");
        assert!(!token.verify_welcome(&nonce, &Join { role: Role::Frontend as u32, ..j }, &w), "another role");
        assert!(!token.verify_welcome(&nonce, &j, &Welcome { epoch: u32::MAX, ..w }), "another epoch");
        assert!(!token.verify_welcome(&nonce, &j, &Welcome { models: 2, ..w }), "another model count");
        assert!(!token.verify_welcome(&nonce, &j, &Welcome { control_delay_ns: 1, ..w }), "another delay");
        assert!(!token.verify_welcome(&nonce, &j, &Welcome { mac: [0; wire::MAC_LEN], ..w }), "unsigned");
        // The peer's own Join MAC is no Welcome MAC (another key and domain).
        assert!(!token.verify_welcome(&nonce, &j, &Welcome { mac: j.mac, ..w }));
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
