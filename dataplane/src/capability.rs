//! Per-task capabilities (issue 55): the scheduler's signature on "backend
//! B may READ frontend F's input I of task T, and answer T".
//!
//! The scheduler signs every task it puts in a batch plan
//! ([`wire::BatchTask::capability`](crate::wire::BatchTask)); the backend
//! hands the capability back in the task's completion
//! ([`wire::CompletionHead`](crate::wire::CompletionHead)). The frontend
//! knows the task's input (its own staging slot) and which backend sent the
//! completion (the data link that proved that backend's membership), so it
//! recomputes the capability and refuses a completion whose capability does
//! not verify: a member backend cannot answer a task planned to another one.
//!
//! The MAC is SipHash-2-4 with its 128-bit output (a keyed pseudo-random
//! function designed as a MAC for short inputs, under a 128-bit key) keyed
//! with the first 16 bytes of [`JoinToken::derive_key`] of
//! [`CAPABILITY_LABEL`] (independent of every Join MAC and of the other
//! derived keys), over the grant's 32 bytes in a fixed little-endian layout;
//! its 16-byte output is the capability. It replaced HMAC-SHA256 truncated
//! to 16 bytes (the Join MAC), which cost 87 ns per sign and 99 ns per
//! verify against SipHash's 29 and 33 (`cargo bench -p dataplane --bench
//! capability` measures both side by side): signing is on the scheduler's
//! per-task budget of 400 ns (issue 50); docs/decisions.md "Capability
//! MAC" says why SipHash suffices. The key is expanded once
//! ([`CapabilityKey::from_token`]); signing and checking copy the keyed
//! state (four words) and hash the grant, with no allocation, and a check
//! compares tags in constant time.
//! Without a join token (`--open-membership`) there is no key: nothing is
//! signed (capabilities are zero) and nothing is checked.
//!
//! On TCP the capability also gates the READ itself: the backend presents
//! it with each READ ([`ReadGrant`], carried in the `ReadRequest`), and
//! the frontend's responder checks it with the [`ReadVerifier`] it
//! installed when the backend's data link was admitted (the link's backend
//! id is known then), refusing and counting ([`refused_reads`]) a READ of
//! anything the plan did not hand that backend. shm and RDMA READs are
//! one-sided (the peer maps the file; the NIC answers): no owner code sees
//! them, so there only the region key's secrecy holds.

use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip128::{Hasher128, SipHasher24};
use subtle::ConstantTimeEq;

use crate::join::JoinToken;
use crate::mem::RemoteRef;
/// A capability as it travels, and its length (defined with the wire
/// messages that carry it): 128 bits, as much as a forger would have to
/// guess blindly.
pub use crate::wire::{Capability, CAPABILITY_LEN};

/// The [`JoinToken::derive_key`] label of the capability key.
pub const CAPABILITY_LABEL: &[u8] = b"symphony read capability v1";

/// What a capability grants: `backend` may read `input` (a region of
/// frontend `frontend`) for task `task`, and answer that task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The backend the task was planned to.
    pub backend: u32,
    /// The frontend that owns the input.
    pub frontend: u32,
    /// The task.
    pub task: u64,
    /// Where its input lives at the frontend.
    pub input: RemoteRef,
}

impl Grant {
    /// The MAC's input: the fields in a fixed little-endian layout.
    fn bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..4].copy_from_slice(&self.backend.to_le_bytes());
        b[4..8].copy_from_slice(&self.frontend.to_le_bytes());
        b[8..16].copy_from_slice(&self.task.to_le_bytes());
        b[16..20].copy_from_slice(&self.input.key.to_le_bytes());
        b[20..24].copy_from_slice(&self.input.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.input.offset.to_le_bytes());
        b
    }
}

/// The key that signs and checks capabilities (see the module docs). Its
/// `Debug` output never shows the key.
#[derive(Clone)]
pub struct CapabilityKey {
    keyed: SipHasher24,
}

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey(<secret>)")
    }
}

impl CapabilityKey {
    /// The cluster's capability key, derived from its join token.
    pub fn from_token(token: &JoinToken) -> CapabilityKey {
        let derived = token.derive_key(CAPABILITY_LABEL);
        // derive_key is HMAC-SHA256, a PRF: any 16 of its bytes are a
        // uniform 128-bit key.
        let mut key = [0u8; 16];
        key.copy_from_slice(&derived[..16]);
        CapabilityKey { keyed: SipHasher24::new_with_key(&key) }
    }

    /// The capability for `grant`.
    pub fn sign(&self, grant: &Grant) -> Capability {
        let mut mac = self.keyed;
        mac.write(&grant.bytes());
        mac.finish128().as_bytes()
    }

    /// Whether `cap` is the capability for `grant` (constant time).
    pub fn verify(&self, grant: &Grant, cap: &Capability) -> bool {
        // One 128-bit constant-time comparison (a byte-slice `ct_eq` costs
        // a barrier per byte).
        u128::from_le_bytes(self.sign(grant)).ct_eq(&u128::from_le_bytes(*cap)).into()
    }
}

/// What a READ presents besides where it reads: the task it serves and the
/// capability the plan gave for it (zero: none, as under open membership).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadGrant {
    /// The task whose input is read.
    pub task: u64,
    /// The scheduler's capability for that task at this backend.
    pub capability: Capability,
}

/// Checks the READs one admitted data link asks for (the frontend's TCP
/// responder): each must present the capability of a task planned to the
/// link's backend whose input is exactly the range read. Copying it costs
/// nothing per READ: the keyed state is four words, and a check hashes 32
/// bytes on the stack.
#[derive(Clone, Debug)]
pub struct ReadVerifier {
    key: CapabilityKey,
    backend: u32,
    frontend: u32,
}

impl ReadVerifier {
    /// READs by `backend` of frontend `frontend`'s memory, checked under `key`.
    pub fn new(key: CapabilityKey, backend: u32, frontend: u32) -> ReadVerifier {
        ReadVerifier { key, backend, frontend }
    }

    /// Whether a READ of `input` presenting `grant` is one the plan allowed;
    /// a refusal is counted ([`refused_reads`]).
    pub fn allows(&self, input: RemoteRef, grant: &ReadGrant) -> bool {
        let g = Grant { backend: self.backend, frontend: self.frontend, task: grant.task, input };
        let ok = self.key.verify(&g, &grant.capability);
        if !ok {
            REFUSED_READS.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }
}

static REFUSED_READS: AtomicU64 = AtomicU64::new(0);

/// READs this process refused because their capability did not verify for
/// the reading backend (another task's, a forged one, none), since start.
/// Exported by the frontend as `symphony_frontend_refused_reads`.
pub fn refused_reads() -> u64 {
    REFUSED_READS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant { backend: 3, frontend: 1, task: 0x0001_0000_0000_0007, input: RemoteRef { key: 0xabcd_0001, len: 64, offset: 4096 } }
    }

    #[test]
    fn a_capability_verifies_for_its_grant_only() {
        let token = JoinToken::new(b"correct horse battery staple").unwrap();
        let key = CapabilityKey::from_token(&token);
        let g = grant();
        let cap = key.sign(&g);
        assert!(key.verify(&g, &cap));
        assert_eq!(cap, key.clone().sign(&g), "signing is deterministic and the key clones");
        let changed = [
            Grant { backend: 4, ..g },
            Grant { frontend: 2, ..g },
            Grant { task: g.task + 1, ..g },
            Grant { input: RemoteRef { key: g.input.key ^ 1, ..g.input }, ..g },
            Grant { input: RemoteRef { len: 65, ..g.input }, ..g },
            Grant { input: RemoteRef { offset: 0, ..g.input }, ..g },
        ];
        for other in changed {
            assert!(!key.verify(&other, &cap), "{other:?} must not verify");
        }
        let mut flipped = cap;
        flipped[CAPABILITY_LEN - 1] ^= 1;
        assert!(!key.verify(&g, &flipped));
        assert!(!key.verify(&g, &[0u8; CAPABILITY_LEN]), "an unsigned task never verifies");
    }

    #[test]
    fn a_read_verifier_allows_the_planned_input_only_and_counts_refusals() {
        let token = JoinToken::new(b"correct horse battery staple").unwrap();
        let key = CapabilityKey::from_token(&token);
        let g = grant();
        let planned = ReadGrant { task: g.task, capability: key.sign(&g) };
        let verifier = ReadVerifier::new(key.clone(), g.backend, g.frontend);
        let before = refused_reads();
        assert!(verifier.allows(g.input, &planned));
        let neighbour = RemoteRef { offset: g.input.offset + 64, ..g.input };
        assert!(!verifier.allows(neighbour, &planned), "another slot under the same capability");
        assert!(!verifier.allows(g.input, &ReadGrant { task: g.task + 1, ..planned }), "another task id");
        assert!(!verifier.allows(g.input, &ReadGrant::default()), "no capability");
        let other_backend = ReadVerifier::new(key, g.backend + 1, g.frontend);
        assert!(!other_backend.allows(g.input, &planned), "a capability planned to another backend");
        assert!(refused_reads() >= before + 4);
    }

    #[test]
    fn the_key_is_the_tokens_and_independent_of_other_derived_keys() {
        let token = JoinToken::new(b"correct horse battery staple").unwrap();
        let other = JoinToken::new(b"another sixteen-byte token").unwrap();
        let g = grant();
        let cap = CapabilityKey::from_token(&token).sign(&g);
        assert!(!CapabilityKey::from_token(&other).verify(&g, &cap));
        // The data-link token's form (another label) signs differently.
        let data = token.for_purpose(crate::join::DATA_LINK_LABEL);
        assert!(!CapabilityKey::from_token(&data).verify(&g, &cap));
        assert_eq!(format!("{:?}", CapabilityKey::from_token(&token)), "CapabilityKey(<secret>)");
    }
}
