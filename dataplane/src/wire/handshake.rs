//! Who a peer is and the authenticated registration: [`Role`],
//! [`Register`], the scheduler's [`Challenge`], a peer's [`Join`], and
//! the answer ([`Welcome`] or [`Refused`]); [`peek_peer`] reads the
//! version-independent preamble of a peer's first message.

use super::*;

/// Bytes of the MAC in a [`Join`] (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Bytes of the nonce in a [`Challenge`] and in a [`Join`].
pub const NONCE_LEN: usize = 32;
/// Bytes of the operator text in a [`Refused`].
pub const REFUSAL_TEXT_LEN: usize = 128;
/// Bytes of the endpoint text in [`Register`].
pub const ENDPOINT_LEN: usize = 64;

/// Role of a process in the cluster.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Client-facing frontend (owns staged inputs).
    Frontend = 1,
    /// GPU backend.
    Backend = 2,
    /// The scheduler.
    Scheduler = 3,
    /// A load generator or tool.
    Client = 4,
}

impl Role {
    /// The role with wire code `v`.
    pub fn from_u32(v: u32) -> Option<Role> {
        Some(match v {
            1 => Role::Frontend,
            2 => Role::Backend,
            3 => Role::Scheduler,
            4 => Role::Client,
            _ => return None,
        })
    }
}

/// "I am `role` number `id`": a backend's first message on its data link
/// to a frontend, and the scheduler's announcement of a frontend to the
/// backends (`Register{Frontend, id, 0, data endpoint}`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Register {
    /// [`Role`] code.
    pub role: u32,
    /// Id within the role.
    pub id: u32,
    /// Role-specific count (e.g. GPUs of a backend); 0 if unused.
    pub count: u32,
    /// Zero.
    pub reserved: u32,
    /// Where this process can be reached for data (e.g. "10.0.0.5:7001"),
    /// UTF-8, zero padded.
    pub endpoint: [u8; ENDPOINT_LEN],
}


impl Register {
    /// A registration; `endpoint` is cut to [`ENDPOINT_LEN`] bytes.
    pub fn new(role: Role, id: u32, count: u32, endpoint: &str) -> Self {
        Register {
            role: role as u32,
            id,
            count,
            reserved: 0,
            endpoint: fill_text(endpoint),
        }
    }
}

/// The accessors of the messages that say who a peer is ([`Register`] and
/// [`Join`]): one definition, so the two cannot drift apart.
macro_rules! peer_identity_accessors {
    ($($t:ty),*) => {$(
        impl $t {
            /// The role (validated by the decoder).
            pub fn role(&self) -> Option<Role> {
                Role::from_u32(self.role)
            }
            /// The endpoint text (validated by the decoder).
            pub fn endpoint(&self) -> &str {
                padded_text(&self.endpoint).unwrap_or("")
            }
        }
    )*};
}
peer_identity_accessors!(Register, Join);

/// Copies `text` into a zero-padded field, cut at a character boundary.
fn fill_text<const N: usize>(text: &str) -> [u8; N] {
    let mut e = [0u8; N];
    let mut n = text.len().min(N);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    e[..n].copy_from_slice(&text.as_bytes()[..n]);
    e
}

/// The text of a zero-padded field, if it is UTF-8 followed only by zeros.
fn padded_text(field: &[u8]) -> Option<&str> {
    let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    if field[n..].iter().any(|&b| b != 0) {
        return None;
    }
    std::str::from_utf8(&field[..n]).ok()
}

/// [`Challenge::flags`]: the scheduler requires a join token.
pub const CHALLENGE_TOKEN_REQUIRED: u32 = 1;
/// [`Join::flags`]: `mac` holds a MAC (the peer has a token).
pub const JOIN_HAS_MAC: u32 = 1;
/// [`Join::flags`]: a backend that reports when its data links to the
/// frontends are up (`Drain` stage `Ready`, the join gate); its GPUs join
/// matchmaking then. Without it, at registration.
pub const JOIN_REPORTS_READY: u32 = 2;

/// The scheduler's first message on every accepted link: a fresh nonce and
/// the peer versions it accepts. Layout frozen for every version (see the
/// module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Challenge {
    /// Random bytes the peer's MAC must cover.
    pub nonce: [u8; NONCE_LEN],
    /// Oldest peer version accepted.
    pub oldest_version: u16,
    /// The scheduler's own (newest accepted) version.
    pub scheduler_version: u16,
    /// [`CHALLENGE_TOKEN_REQUIRED`] or 0 (other bits: ignored).
    pub flags: u32,
    /// Zero (ignored).
    pub reserved: u64,
}

impl Challenge {
    /// A challenge of this version.
    pub fn new(nonce: [u8; NONCE_LEN], token_required: bool) -> Self {
        Challenge {
            nonce,
            oldest_version: OLDEST_PEER_VERSION,
            scheduler_version: VERSION,
            flags: if token_required { CHALLENGE_TOKEN_REQUIRED } else { 0 },
            reserved: 0,
        }
    }
    /// Whether the scheduler requires a join token.
    pub fn token_required(&self) -> bool {
        self.flags & CHALLENGE_TOKEN_REQUIRED != 0
    }
}

/// A peer's registration with the scheduler, answering its [`Challenge`]:
/// "I am `role` number `id`", with the MAC that proves the join token
/// (`join::JoinToken::sign`). A backend sends its [`Kind::Models`] next.
/// `role` and `id` stay the first 8 bytes in every version.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Join {
    /// [`Role`] code (Frontend or Backend).
    pub role: u32,
    /// Id within the role.
    pub id: u32,
    /// Role-specific count (a backend's GPUs); 0 if unused.
    pub count: u32,
    /// [`JOIN_HAS_MAC`] or 0.
    pub flags: u32,
    /// A frontend's data endpoint (UTF-8, zero padded); empty otherwise.
    pub endpoint: [u8; ENDPOINT_LEN],
    /// The peer's fresh random nonce, which the [`Welcome`]'s MAC must
    /// cover (so a recorded Welcome never answers another Join); zero
    /// without a token.
    pub nonce: [u8; NONCE_LEN],
    /// HMAC-SHA256 over the challenge and the fields above; zero without
    /// a token.
    pub mac: [u8; MAC_LEN],
}

impl Join {
    /// A join without a MAC (set `mac` and `flags` with
    /// [`with_mac`](Self::with_mac)); `endpoint` is cut to
    /// [`ENDPOINT_LEN`] bytes.
    pub fn new(role: Role, id: u32, count: u32, endpoint: &str) -> Self {
        Join {
            role: role as u32,
            id,
            count,
            flags: 0,
            endpoint: fill_text(endpoint),
            nonce: [0; NONCE_LEN],
            mac: [0; MAC_LEN],
        }
    }
    /// This join carrying the peer's `nonce` (set before signing: the MAC
    /// covers it).
    pub fn with_nonce(mut self, nonce: [u8; NONCE_LEN]) -> Self {
        self.nonce = nonce;
        self
    }
    /// This (backend's) join promising to report its readiness
    /// ([`JOIN_REPORTS_READY`]; set before signing: the MAC covers it).
    pub fn reporting_ready(mut self) -> Self {
        self.flags |= JOIN_REPORTS_READY;
        self
    }
    /// Whether the peer reports its readiness ([`JOIN_REPORTS_READY`]).
    pub fn reports_ready(&self) -> bool {
        self.flags & JOIN_REPORTS_READY != 0
    }
    /// This join carrying `mac`.
    pub fn with_mac(mut self, mac: [u8; MAC_LEN]) -> Self {
        self.flags |= JOIN_HAS_MAC;
        self.mac = mac;
        self
    }
    /// Whether it carries a MAC.
    pub fn has_mac(&self) -> bool {
        self.flags & JOIN_HAS_MAC != 0
    }
}

/// The scheduler accepted a [`Join`]: what every peer must agree on.
/// With a join token, `mac` proves the scheduler holds it
/// (`join::JoinToken::sign_welcome`); a peer holding a token takes
/// nothing from a Welcome whose MAC does not verify.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Welcome {
    /// Models in the scheduler's list (the peer's must be as many).
    pub models: u32,
    /// The scheduler's election epoch (0: no election, the embedded
    /// default). A backend that has seen a newer epoch leaves a scheduler
    /// that welcomes it with an older one, and never executes a plan of an
    /// older epoch than the newest it has seen.
    pub epoch: u32,
    /// The one-way control delay bound `d_ctrl` the scheduler charges,
    /// ns: backends subtract it from a plan's `exec_in`.
    pub control_delay_ns: u64,
    /// HMAC-SHA256 under the token's welcome key over the challenge, the
    /// peer's Join (its nonce included) and the fields above; zero
    /// without a token.
    pub mac: [u8; MAC_LEN],
}

impl Welcome {
    /// An unsigned Welcome (sign it with `join::JoinToken::sign_welcome`).
    pub fn new(models: u32, epoch: u32, control_delay_ns: u64) -> Self {
        Welcome { models, epoch, control_delay_ns, mac: [0; MAC_LEN] }
    }
}

/// Why the scheduler refused a registration. Wire codes are stable; a new
/// reason takes the next code (a peer shows an unknown one by its code).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// The peer speaks a wire version the scheduler does not accept.
    Version = 1,
    /// The scheduler requires a join token and the peer sent no MAC.
    NoToken = 2,
    /// The MAC does not verify (wrong token).
    BadToken = 3,
    /// The registration did not decode or broke the handshake's order.
    Malformed = 4,
    /// The plane refused it: duplicate or out-of-range id, unknown model,
    /// no sub-cluster, no GPUs.
    Rejected = 5,
    /// The configured peer limit is reached.
    Full = 6,
    /// It did not register within the handshake timeout.
    Timeout = 7,
}

impl RefuseReason {
    /// Number of reasons.
    pub const COUNT: usize = 7;
    /// Every reason, in wire-code order.
    pub const ALL: [RefuseReason; RefuseReason::COUNT] = [
        RefuseReason::Version,
        RefuseReason::NoToken,
        RefuseReason::BadToken,
        RefuseReason::Malformed,
        RefuseReason::Rejected,
        RefuseReason::Full,
        RefuseReason::Timeout,
    ];
    /// The reason with wire code `v`.
    pub fn from_u32(v: u32) -> Option<RefuseReason> {
        let i = usize::try_from(v).ok()?.checked_sub(1)?;
        RefuseReason::ALL.get(i).copied()
    }
    /// Its position in [`ALL`](Self::ALL) (a counter array's index).
    pub const fn index(self) -> usize {
        self as usize - 1
    }
    /// Stable snake_case name: metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            RefuseReason::Version => "version",
            RefuseReason::NoToken => "no_token",
            RefuseReason::BadToken => "bad_token",
            RefuseReason::Malformed => "malformed",
            RefuseReason::Rejected => "rejected",
            RefuseReason::Full => "full",
            RefuseReason::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The scheduler refused a registration and closes the link. Layout
/// frozen for every version (see the module docs), so that a peer of any
/// version can show why.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Refused {
    /// [`RefuseReason`] code (an unknown code is shown as a number).
    pub reason: u32,
    /// The scheduler's wire version.
    pub scheduler_version: u16,
    /// The peer's wire version, as the scheduler read it.
    pub peer_version: u16,
    /// Why, for the operator (UTF-8, zero padded).
    pub text: [u8; REFUSAL_TEXT_LEN],
}

impl Refused {
    /// A refusal of a peer of `peer_version`; `text` is cut to
    /// [`REFUSAL_TEXT_LEN`] bytes.
    pub fn new(reason: RefuseReason, peer_version: u16, text: &str) -> Self {
        Refused {
            reason: reason as u32,
            scheduler_version: VERSION,
            peer_version,
            text: fill_text(text),
        }
    }
    /// The reason, if this version knows its code.
    pub fn reason(&self) -> Option<RefuseReason> {
        RefuseReason::from_u32(self.reason)
    }
    /// The operator text (invalid UTF-8 shows as replacement characters).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        let n = self.text.iter().position(|&b| b == 0).unwrap_or(REFUSAL_TEXT_LEN);
        String::from_utf8_lossy(&self.text[..n])
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{r}")?,
            None => write!(f, "reason code {}", self.reason)?,
        }
        write!(
            f,
            " (scheduler wire version {}, ours {}): {}",
            self.scheduler_version,
            self.peer_version,
            self.text()
        )
    }
}

/// The version-independent part of a peer's first message
/// ([`peek_peer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPeek {
    /// The header's version.
    pub version: u16,
    /// The header's kind code.
    pub kind: u16,
    /// The first body word: the role code.
    pub role: u32,
    /// The second body word: the id.
    pub id: u32,
}

impl std::fmt::Display for PeerPeek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match Role::from_u32(self.role) {
            Some(Role::Frontend) => write!(f, "frontend {}", self.id),
            Some(Role::Backend) => write!(f, "backend {}", self.id),
            _ => write!(f, "a peer of role code {}", self.role),
        }
    }
}

/// Reads the header's version and the sender's role and id from the first
/// message of a peer of any version (magic checked; nothing else), e.g. to
/// name a peer whose version is refused. `None` if too short or not ours.
pub fn peek_peer(buf: &[u8]) -> Option<PeerPeek> {
    let h: Header = bytemuck::pod_read_unaligned(buf.get(..HEADER_LEN)?);
    let word = |at: usize| -> Option<u32> {
        let b = buf.get(HEADER_LEN + at..HEADER_LEN + at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if h.magic != MAGIC || (h.len as usize) < 8 {
        return None;
    }
    Some(PeerPeek {
        version: h.version,
        kind: h.kind,
        role: word(0)?,
        id: word(4)?,
    })
}

impl FixedMessage for Register {
    const KIND: Kind = Kind::Register;
}
impl FixedMessage for Challenge {
    const KIND: Kind = Kind::Challenge;
}
impl FixedMessage for Join {
    const KIND: Kind = Kind::Join;
}
impl FixedMessage for Welcome {
    const KIND: Kind = Kind::Welcome;
}
impl FixedMessage for Refused {
    const KIND: Kind = Kind::Refused;
}


/// The body of a [`Kind::Register`] message: a known role, a zero reserved
/// word and endpoint text.
pub(super) fn decode_register(body: &[u8]) -> Result<Register, WireError> {
    let r: Register = read_fixed(body)?;
    Role::from_u32(r.role).ok_or(WireError::BadValue("role"))?;
    if r.reserved != 0 {
        return Err(WireError::ReservedNotZero);
    }
    if padded_text(&r.endpoint).is_none() {
        return Err(WireError::BadValue("endpoint"));
    }
    Ok(r)
}

/// The body of a [`Kind::Join`] message: a frontend or a backend, known
/// flags, no MAC or nonce bytes without the MAC flag, and endpoint text.
pub(super) fn decode_join(body: &[u8]) -> Result<Join, WireError> {
    let j: Join = read_fixed(body)?;
    match j.role() {
        Some(Role::Frontend | Role::Backend) => {}
        _ => return Err(WireError::BadValue("role")),
    }
    if j.flags & !(JOIN_HAS_MAC | JOIN_REPORTS_READY) != 0 {
        return Err(WireError::BadValue("join flags"));
    }
    if !j.has_mac() && (j.mac != [0; MAC_LEN] || j.nonce != [0; NONCE_LEN]) {
        return Err(WireError::ReservedNotZero);
    }
    if padded_text(&j.endpoint).is_none() {
        return Err(WireError::BadValue("endpoint"));
    }
    Ok(j)
}
