//! TLS under the stream framing (issue 55): a byte mover ([`TlsIo`]) that
//! encrypts what the stream sends and decrypts what it receives, with
//! rustls's sans-IO connection (`read_tls`, `process_new_packets`,
//! `reader`, `writer`, `write_tls`) over plain socket syscalls. The
//! framing, the READ emulation and everything above see the same bytes
//! as on a plaintext link; the wire format does not change.
//!
//! Why under the framing and not a TLS stream type above it: the stream
//! already owns its buffers, its back-pressure and its wake-up (`wait`
//! on the socket); a byte mover beside the plain and io_uring ones keeps
//! all of that, and a plaintext link pays nothing for TLS being built in.
//! Whichever engine a domain names, a TLS link moves its ciphertext with
//! plain syscalls (nonblocking receives, sends bounded by the socket's
//! send timeout): io_uring's in-flight buffers would need a second
//! ciphertext staging area, for a gain not measured.
//!
//! A TLS failure (a plaintext peer on a TLS port, a certificate the CA
//! did not sign, a missing client certificate, a bad record, a peer that
//! hangs up mid-handshake) fails the link with an `InvalidData` error,
//! sends the alert rustls queued if the socket takes it, and is counted
//! ([`links_closed_on_tls_failure`]). Nothing panics, and other links go on.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::sys::{last_os_error_result, retryable, wait_readable};

/// Most bytes of one certificate, key or CA file: far above any real
/// chain, and a bound on what a wrong path (a device, a log) can make us read.
pub const MAX_PEM_FILE: u64 = 1 << 20;

/// Most bytes rustls holds for sending (plaintext before the handshake
/// ends, records after): the stream's own queue is the back-pressure, and
/// this keeps the layer under it from growing without bound.
const SEND_BUFFER_LIMIT: usize = 256 << 10;

/// Socket reads per receive poll at most: rustls reads up to 4 KiB at a
/// time, so a poll takes a few records when a burst is waiting.
const READS_PER_POLL: usize = 8;

/// Rounds of `write_tls` per flush at most (each writes up to 64 records).
const WRITES_PER_FLUSH: usize = 64;

static TLS_FAILED_LINKS: AtomicU64 = AtomicU64::new(0);

/// Links this process closed because TLS failed on them (handshake refused,
/// bad record, a peer that is not TLS), since it started.
pub fn links_closed_on_tls_failure() -> u64 {
    TLS_FAILED_LINKS.load(Ordering::Relaxed)
}

fn count_tls_failure() {
    TLS_FAILED_LINKS.fetch_add(1, Ordering::Relaxed);
}

/// Why a link TLS configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LinkTlsError {
    /// A PEM file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A PEM file is larger than [`MAX_PEM_FILE`].
    #[error("{}: larger than {MAX_PEM_FILE} bytes: not a certificate or key file", path.display())]
    TooLarge {
        /// The file.
        path: std::path::PathBuf,
    },
    /// A PEM section does not parse.
    #[error("link TLS {what}: {source}")]
    Pem {
        /// "certificate", "private key" or "CA certificate".
        what: &'static str,
        /// The parser's error.
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate file holds no certificate.
    #[error("link TLS {0}: no certificate in the PEM file")]
    NoCertificate(&'static str),
    /// A combination of options that cannot work.
    #[error("{0}")]
    Options(&'static str),
    /// rustls refused the configuration (a key that does not match its
    /// certificate, a CA it cannot use).
    #[error("link TLS: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier cannot be built from the CA.
    #[error("link TLS client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// TLS for a tcp domain's links: the server side (the accepting daemon's
/// certificate and key, and, for mutual TLS, the CA its clients' certificates
/// must chain to) and the client side (the CA the server's certificate must
/// chain to, and the client's own certificate and key when it has them).
#[derive(Clone)]
pub struct LinkTls {
    server: Option<Arc<rustls::ServerConfig>>,
    client: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("LinkTls")
            .field("server", &self.server.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// Reads a PEM file, refusing one over [`MAX_PEM_FILE`] bytes.
pub fn read_pem_file(path: &Path) -> Result<Vec<u8>, LinkTlsError> {
    let file = std::fs::File::open(path).map_err(|source| LinkTlsError::Read { path: path.to_path_buf(), source })?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| LinkTlsError::Read { path: path.to_path_buf(), source })?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(LinkTlsError::TooLarge { path: path.to_path_buf() });
    }
    Ok(bytes)
}

fn certificates(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, LinkTlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|source| LinkTlsError::Pem { what, source })?;
    if certs.is_empty() {
        return Err(LinkTlsError::NoCertificate(what));
    }
    Ok(certs)
}

fn roots(ca_pem: &[u8]) -> Result<Arc<rustls::RootCertStore>, LinkTlsError> {
    let mut store = rustls::RootCertStore::empty();
    for cert in certificates(ca_pem, "CA certificate")? {
        store.add(cert)?;
    }
    Ok(Arc::new(store))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The PEM contents a [`LinkTls`] is built from.
#[derive(Clone, Default)]
pub struct LinkTlsPem {
    /// This daemon's certificate chain, leaf first (serves accepted links;
    /// presented to servers that ask).
    pub cert: Option<Vec<u8>>,
    /// Its private key.
    pub key: Option<Vec<u8>>,
    /// The CA servers' certificates (and, with `client_auth`, clients')
    /// must chain to.
    pub ca: Option<Vec<u8>>,
    /// Accepted links must present a certificate the CA signed.
    pub client_auth: bool,
}

impl LinkTls {
    /// Builds both sides from PEM: the server side when a certificate and
    /// key are given, the client side when a CA is. Refuses a certificate
    /// without its key (or the reverse), nothing at all, and client
    /// authentication without a CA or without a certificate of our own.
    pub fn from_pem(pem: &LinkTlsPem) -> Result<LinkTls, LinkTlsError> {
        let identity = match (&pem.cert, &pem.key) {
            (Some(c), Some(k)) => Some((
                certificates(c, "certificate")?,
                PrivateKeyDer::from_pem_slice(k).map_err(|source| LinkTlsError::Pem { what: "private key", source })?,
            )),
            (None, None) => None,
            _ => return Err(LinkTlsError::Options("--link-tls-cert and --link-tls-key go together")),
        };
        let roots = pem.ca.as_deref().map(roots).transpose()?;
        if identity.is_none() && roots.is_none() {
            return Err(LinkTlsError::Options("link TLS needs --link-tls-cert/--link-tls-key (accepting links) or --link-tls-ca (connecting)"));
        }
        if pem.client_auth && (roots.is_none() || identity.is_none()) {
            return Err(LinkTlsError::Options("--link-tls-client-auth needs --link-tls-ca and --link-tls-cert/--link-tls-key"));
        }
        let server = match &identity {
            Some((certs, key)) => {
                let builder = rustls::ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
                let builder = match (&roots, pem.client_auth) {
                    (Some(r), true) => builder.with_client_cert_verifier(
                        rustls::server::WebPkiClientVerifier::builder_with_provider(r.clone(), provider()).build()?,
                    ),
                    _ => builder.with_no_client_auth(),
                };
                Some(Arc::new(builder.with_single_cert(certs.clone(), key.clone_key())?))
            }
            None => None,
        };
        let client = match roots {
            Some(r) => {
                let builder = rustls::ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(r);
                Some(Arc::new(match identity {
                    Some((certs, key)) => builder.with_client_auth_cert(certs, key)?,
                    None => builder.with_no_client_auth(),
                }))
            }
            None => None,
        };
        Ok(LinkTls { server, client })
    }

    /// [`from_pem`](Self::from_pem) from files (each read once, bounded).
    pub fn from_files(cert: Option<&Path>, key: Option<&Path>, ca: Option<&Path>, client_auth: bool) -> Result<LinkTls, LinkTlsError> {
        Self::from_pem(&LinkTlsPem {
            cert: cert.map(read_pem_file).transpose()?,
            key: key.map(read_pem_file).transpose()?,
            ca: ca.map(read_pem_file).transpose()?,
            client_auth,
        })
    }

    /// The server end of an accepted link.
    pub(crate) fn accept(&self) -> Result<rustls::Connection, io::Error> {
        let cfg = self.server.clone().ok_or_else(|| {
            count_tls_failure();
            io::Error::other("link TLS: this daemon has no --link-tls-cert/--link-tls-key to accept links with")
        })?;
        let conn = rustls::ServerConnection::new(cfg).map_err(io::Error::other)?;
        Ok(rustls::Connection::Server(conn))
    }

    /// The client end of a link to `addr` (HOST:PORT): the server's
    /// certificate must name HOST (a DNS name, or an IP address SAN).
    pub(crate) fn connect(&self, addr: &str) -> Result<rustls::Connection, io::Error> {
        let cfg = self
            .client
            .clone()
            .ok_or_else(|| io::Error::other("link TLS: no --link-tls-ca to verify the server with"))?;
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "link TLS: the address's host is no DNS name or IP address"))?;
        let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
        Ok(rustls::Connection::Client(conn))
    }
}

/// The process's link TLS, set once from its command line (see
/// `node_shell::LinkTlsArgs`): like the RDMA selection, a daemon opens
/// its tcp domain once, deep inside `control::with_domain`, long after
/// its flags were parsed.
static LINK_TLS: OnceLock<LinkTls> = OnceLock::new();

/// Makes `tls` the process's link TLS; the first call wins (a process has
/// one command line). Tcp domains opened by `control::with_domain` use it.
pub fn select_link_tls(tls: LinkTls) {
    let _ = LINK_TLS.set(tls);
}

/// The process's link TLS, if one was selected.
pub fn selected_link_tls() -> Option<LinkTls> {
    LINK_TLS.get().cloned()
}

/// The socket as rustls's reader and writer: receives never block (the
/// stream polls), sends block up to the socket's send timeout.
struct Socket(RawFd);

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        last_os_error_result(unsafe { libc::recv(self.0, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) })
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec on Unix (std documents it).
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        // SAFETY: `msg` points at `bufs.len()` valid iovecs over live slices.
        last_os_error_result(unsafe { libc::sendmsg(self.0, &msg, libc::MSG_NOSIGNAL) })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The TLS byte mover (see the module documentation).
pub(crate) struct TlsIo {
    pub(super) fd: RawFd,
    conn: rustls::Connection,
    recv: Option<(*mut u8, usize)>,
    pub(super) sent: Option<io::Result<usize>>,
    /// The socket reported end of stream (or the peer's close_notify came).
    eof: bool,
    /// TLS failed: every further operation reports this.
    failed: bool,
    /// Decrypted bytes rustls holds that no receive has taken yet: input
    /// the socket no longer reports.
    plain_left: usize,
}

fn tls_failure(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("link TLS: {why}"))
}

impl TlsIo {
    /// A mover over `fd` for `conn`; a client's hello leaves at once.
    pub(crate) fn new(fd: RawFd, mut conn: rustls::Connection) -> Self {
        conn.set_buffer_limit(Some(SEND_BUFFER_LIMIT));
        let mut io = TlsIo { fd, conn, recv: None, sent: None, eof: false, failed: false, plain_left: 0 };
        // A failure here shows again at the first poll or send.
        let _ = io.flush_tls();
        io
    }

    /// Completes a client's handshake before the link is handed out,
    /// waiting on the socket up to `deadline` (the connect's own bound):
    /// a connect over TLS returns a link whose server is verified, or the
    /// reason it is not. Why the client waits and the server does not: a
    /// daemon's accept must not stall on a peer that says nothing, while
    /// the server polls its accepted links anyway and answers at once.
    pub(crate) fn handshake(&mut self, deadline: std::time::Instant) -> io::Result<()> {
        while self.conn.is_handshaking() {
            self.flush_tls()?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(self.fail("no handshake from the server within the connect timeout"));
            }
            wait_readable(self.fd, left);
            match self.conn.read_tls(&mut Socket(self.fd)) {
                Ok(0) => return Err(self.fail("the server closed during the handshake (not TLS, or it refused us)")),
                Ok(_) => {}
                Err(e) if retryable(&e) => continue,
                Err(e) => return Err(e),
            }
            match self.conn.process_new_packets() {
                Ok(state) => self.plain_left = state.plaintext_bytes_to_read(),
                Err(e) => return Err(self.fail(e)),
            }
        }
        self.flush_tls()
    }

    /// Writes what rustls has queued (handshake, alerts, records). A full
    /// socket (its send timeout passed) leaves the rest for the next call.
    fn flush_tls(&mut self) -> io::Result<()> {
        for _ in 0..WRITES_PER_FLUSH {
            if !self.conn.wants_write() {
                return Ok(());
            }
            match self.conn.write_tls(&mut Socket(self.fd)) {
                Ok(_) => {}
                Err(e) if retryable(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn fail(&mut self, why: impl std::fmt::Display) -> io::Error {
        if !self.failed {
            self.failed = true;
            count_tls_failure();
            // The alert rustls queued, if the socket takes it now.
            let _ = self.flush_tls();
        }
        tls_failure(why)
    }

    pub(super) fn start_recv(&mut self, ptr: *mut u8, len: usize) {
        self.recv = Some((ptr, len));
    }

    pub(super) fn start_send(&mut self, iov: *const libc::iovec, n: usize) {
        if self.failed {
            self.sent = Some(Err(tls_failure("the link failed")));
            return;
        }
        // SAFETY: the caller passes `n` valid iovecs over live memory
        // (start_send contract), and IoSlice is ABI-compatible with iovec.
        let parts = unsafe { std::slice::from_raw_parts(iov as *const IoSlice<'_>, n) };
        let taken = match self.conn.writer().write_vectored(parts) {
            Ok(taken) => taken,
            Err(e) => {
                self.sent = Some(Err(e));
                return;
            }
        };
        self.sent = Some(match self.flush_tls() {
            Ok(()) => Ok(taken),
            Err(e) => Err(e),
        });
    }

    /// Moves decrypted bytes into the armed target: what rustls holds, else
    /// what the socket brings. None: nothing yet.
    fn fill(&mut self, ptr: *mut u8, len: usize) -> Option<io::Result<usize>> {
        if self.failed {
            return Some(Err(tls_failure("the link failed")));
        }
        if let Some(r) = self.take_plain(ptr, len) {
            return Some(r);
        }
        for _ in 0..READS_PER_POLL {
            if self.eof {
                break;
            }
            match self.conn.read_tls(&mut Socket(self.fd)) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if retryable(&e) => break,
                Err(e) => return Some(Err(e)),
            }
            match self.conn.process_new_packets() {
                Ok(state) => {
                    self.plain_left = state.plaintext_bytes_to_read();
                    self.eof |= state.peer_has_closed();
                }
                Err(e) => return Some(Err(self.fail(e))),
            }
            if let Err(e) = self.flush_tls() {
                return Some(Err(e));
            }
            if self.plain_left > 0 {
                break;
            }
        }
        if let Some(r) = self.take_plain(ptr, len) {
            return Some(r);
        }
        if self.eof {
            if self.conn.is_handshaking() {
                return Some(Err(self.fail("the peer closed during the handshake")));
            }
            return Some(Ok(0));
        }
        None
    }

    fn take_plain(&mut self, ptr: *mut u8, len: usize) -> Option<io::Result<usize>> {
        if self.plain_left == 0 || len == 0 {
            return None;
        }
        // SAFETY: the target is valid for `len` bytes (start_recv contract).
        let target = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        match self.conn.reader().read(target) {
            // The peer's close_notify, with nothing left to read.
            Ok(0) => {
                self.plain_left = 0;
                self.eof = true;
                None
            }
            Ok(n) => {
                self.plain_left = self.plain_left.saturating_sub(n);
                Some(Ok(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.plain_left = 0;
                None
            }
            Err(e) => Some(Err(e)),
        }
    }

    pub(super) fn poll(&mut self, recv: &mut Option<io::Result<usize>>, send: &mut Option<io::Result<usize>>) {
        *send = self.sent.take();
        // Records a full socket left in rustls go out at every poll, not
        // only when the peer sends something: a send reports its bytes
        // taken once rustls holds them, so nothing else would push them.
        if let Err(e) = self.flush_tls() {
            if send.is_none() {
                *send = Some(Err(e));
            }
        }
        if let Some((ptr, len)) = self.recv {
            if let Some(r) = self.fill(ptr, len) {
                self.recv = None;
                *recv = Some(r);
            }
        }
    }

    /// Sleeps on the socket until it is readable or `timeout` passes,
    /// unless decrypted input is waiting already.
    pub(super) fn wait(&mut self, timeout: std::time::Duration) {
        if self.recv.is_none() || self.has_input() || self.failed {
            return;
        }
        let _ = self.flush_tls();
        wait_readable(self.fd, timeout);
    }

    /// Input the socket does not report: decrypted bytes not taken yet,
    /// or the end of stream already seen.
    pub(super) fn has_input(&self) -> bool {
        self.plain_left > 0 || self.eof
    }

    /// Says goodbye (close_notify, if the socket takes it without
    /// waiting) and shuts the socket down.
    pub(super) fn quiesce(&mut self) {
        if !self.failed && !self.conn.is_handshaking() {
            self.conn.send_close_notify();
            // Without waiting: a peer that stopped reading gets no say in
            // how long a close takes.
            let mut dont_wait = 0;
            while self.conn.wants_write() && dont_wait < WRITES_PER_FLUSH {
                dont_wait += 1;
                match self.conn.write_tls(&mut NonBlocking(self.fd)) {
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        // SAFETY: plain syscall on our fd.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        self.recv = None;
        self.sent = None;
    }
}

/// A writer that never blocks (for the close_notify at shutdown).
struct NonBlocking(RawFd);

impl Write for NonBlocking {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for reads of its length.
        last_os_error_result(unsafe { libc::send(self.0, buf.as_ptr() as *const libc::c_void, buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
#[path = "test_pki.rs"]
mod test_pki;

#[cfg(test)]
mod tests {
    use super::test_pki::{test_pki, TestPki};
    use super::*;
    use crate::transport::tcp::{TcpConfig, TcpConn, TcpDomain};
    use crate::transport::{Connection, Domain, Error, Listener};
    use crate::time::Duration;
    use crate::wire::{self, Heartbeat};

    const BOUND: std::time::Duration = std::time::Duration::from_secs(10);

    fn pem(cert: Option<&(String, String)>, ca: Option<&str>, client_auth: bool) -> LinkTls {
        LinkTls::from_pem(&LinkTlsPem {
            cert: cert.map(|c| c.0.clone().into_bytes()),
            key: cert.map(|c| c.1.clone().into_bytes()),
            ca: ca.map(|c| c.as_bytes().to_vec()),
            client_auth,
        })
        .expect("link TLS")
    }

    fn domain(tls: Option<LinkTls>) -> TcpDomain {
        TcpDomain::with_tls(TcpConfig::new(crate::transport::tcp::Engine::Blocking), tls).expect("domain")
    }

    fn heartbeat(seq: u64) -> ([u8; 64], usize) {
        let mut msg = [0u8; 64];
        let n = wire::encode(&mut msg, &Heartbeat { seq, role: 4, id: 1 }).expect("encode");
        (msg, n)
    }

    /// Polls `conn` until a message arrives (Ok) or the link fails (Err).
    fn next_message(conn: &mut TcpConn) -> Result<Vec<u8>, Error> {
        let t0 = std::time::Instant::now();
        let mut buf = [0u8; 256];
        loop {
            assert!(t0.elapsed() < BOUND, "neither a message nor a failure");
            if let Some(n) = conn.try_recv(&mut buf)? {
                return Ok(buf[..n].to_vec());
            }
            conn.wait(Duration::from_millis(50))?;
        }
    }

    /// (accepted, connected) links: the accepting side is polled (as a
    /// daemon polls its links) while the client's connect handshakes.
    fn pair(server: &TcpDomain, client: &TcpDomain) -> (Result<TcpConn, Error>, Result<TcpConn, Error>, String) {
        let mut listener = server.listen("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr();
        let connected = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let acc = s.spawn(|| {
                let mut a = listener.accept(Duration::from_millis(5_000))?;
                while !connected.load(std::sync::atomic::Ordering::Acquire) {
                    let _ = a.progress();
                    std::thread::yield_now();
                }
                Ok(a)
            });
            let c = client.connect(&addr, Duration::from_millis(5_000));
            connected.store(true, std::sync::atomic::Ordering::Release);
            (acc.join().expect("accept thread"), c, addr.clone())
        })
    }

    /// A message each way over a server and client pair of `LinkTls`.
    fn exchange(server: &TcpDomain, client: &TcpDomain) -> Result<(), Error> {
        let (s, c, _) = pair(server, client);
        let (mut s, mut c) = (s?, c?);
        let (msg, n) = heartbeat(1);
        c.send(&msg[..n])?;
        assert_eq!(next_message(&mut s)?, msg[..n].to_vec());
        let (msg, n) = heartbeat(2);
        s.send(&msg[..n])?;
        assert_eq!(next_message(&mut c)?, msg[..n].to_vec());
        Ok(())
    }

    fn pki() -> TestPki {
        test_pki("symphony link test CA")
    }

    #[test]
    fn messages_cross_a_tls_link_and_mutual_tls() {
        let pki = pki();
        exchange(&domain(Some(pem(Some(&pki.server), None, false))), &domain(Some(pem(None, Some(&pki.ca), false)))).unwrap();
        let mutual_server = domain(Some(pem(Some(&pki.server), Some(&pki.ca), true)));
        exchange(&mutual_server, &domain(Some(pem(Some(&pki.client), Some(&pki.ca), false)))).unwrap();
    }

    /// A link whose handshake must fail: the client's connect fails, or
    /// its first send or receive does (a TLS 1.3 client finishes before
    /// the server has checked its certificate); the server side never
    /// delivers a message; the failure is counted; and the same domain
    /// then still serves a good client.
    fn refused(server: &TcpDomain, client: &TcpDomain, good_client: &TcpDomain) {
        let before = links_closed_on_tls_failure();
        let (s, c, _) = pair(server, client);
        let (msg, n) = heartbeat(3);
        let mut c = c.ok();
        // What the client sends before it learns it was refused.
        let sent = c.as_mut().is_some_and(|c| c.send(&msg[..n]).is_ok());
        let mut s = s.expect("accepted");
        assert!(next_message(&mut s).is_err(), "the server must not deliver a refused client's bytes");
        assert!(!s.is_connected());
        if let Some(c) = c.as_mut() {
            assert!(!sent || next_message(c).is_err(), "the refused client's link must fail");
        }
        assert!(links_closed_on_tls_failure() > before, "a TLS failure is counted");
        exchange(server, good_client).expect("a good client is still served");
    }

    #[test]
    fn a_certificate_another_ca_signed_is_refused() {
        let (pki, other) = (pki(), test_pki("another CA"));
        let server = domain(Some(pem(Some(&pki.server), None, false)));
        refused(&server, &domain(Some(pem(None, Some(&other.ca), false))), &domain(Some(pem(None, Some(&pki.ca), false))));
        // And a server certificate the client's CA did not sign, the other way round.
        let rogue = domain(Some(pem(Some(&other.server), None, false)));
        let before = links_closed_on_tls_failure();
        assert!(exchange(&rogue, &domain(Some(pem(None, Some(&pki.ca), false)))).is_err());
        assert!(links_closed_on_tls_failure() > before);
    }

    #[test]
    fn a_client_without_a_certificate_is_refused_when_client_auth_is_required() {
        let pki = pki();
        let server = domain(Some(pem(Some(&pki.server), Some(&pki.ca), true)));
        let anonymous = domain(Some(pem(None, Some(&pki.ca), false)));
        let with_cert = domain(Some(pem(Some(&pki.client), Some(&pki.ca), false)));
        refused(&server, &anonymous, &with_cert);
    }

    #[test]
    fn a_plaintext_peer_on_a_tls_port_and_a_tls_peer_on_a_plaintext_port_are_closed() {
        let pki = pki();
        let tls_server = domain(Some(pem(Some(&pki.server), None, false)));
        let tls_client = domain(Some(pem(None, Some(&pki.ca), false)));
        refused(&tls_server, &domain(None), &tls_client);
        // A TLS client on a plaintext port: the server closes it for bad
        // bytes, the client for a handshake that never finished.
        let before = links_closed_on_tls_failure();
        let bad_before = crate::transport::links_closed_on_bad_bytes();
        let (s, c, _) = pair(&domain(None), &tls_client);
        assert!(c.is_err(), "a TLS client gets no link from a plaintext port");
        assert!(next_message(&mut s.expect("accepted")).is_err());
        assert!(crate::transport::links_closed_on_bad_bytes() > bad_before);
        assert!(links_closed_on_tls_failure() > before);
    }

    /// Raw bytes on a TLS port: a garbage record and a record cut short
    /// by the peer's close each close that link, counted, no panic.
    #[test]
    fn garbage_and_truncated_records_close_the_link() {
        use std::io::Write as _;
        let pki = pki();
        let server = domain(Some(pem(Some(&pki.server), None, false)));
        let mut listener = server.listen("127.0.0.1:0").unwrap();
        let addr = listener.local_addr();
        let garbage: Vec<u8> = [0x16, 0x03, 0x01, 0x00, 0x40].into_iter().chain((0..64u8).map(|i| i.wrapping_mul(37))).collect();
        let truncated: Vec<u8> = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00];
        let huge: Vec<u8> = vec![0x17, 0x03, 0x03, 0xff, 0xff, 0, 0, 0];
        for (i, bytes) in [garbage, truncated, huge].into_iter().enumerate() {
            let before = links_closed_on_tls_failure();
            let mut raw = std::net::TcpStream::connect(&addr).unwrap();
            let mut s = listener.accept(Duration::from_millis(5_000)).unwrap();
            raw.write_all(&bytes).unwrap();
            raw.shutdown(std::net::Shutdown::Write).unwrap();
            assert!(next_message(&mut s).is_err(), "case {i}");
            assert!(links_closed_on_tls_failure() > before, "case {i} counted");
        }
        exchange(&server, &domain(Some(pem(None, Some(&pki.ca), false)))).unwrap();
    }

    #[test]
    fn options_that_cannot_work_are_refused_with_a_reason() {
        let pki = pki();
        let refuse = |p: LinkTlsPem| LinkTls::from_pem(&p).unwrap_err().to_string();
        let cert = Some(pki.server.0.clone().into_bytes());
        assert!(refuse(LinkTlsPem { cert: cert.clone(), ..Default::default() }).contains("go together"));
        assert!(refuse(LinkTlsPem::default()).contains("needs"));
        let no_ca = LinkTlsPem { cert: cert.clone(), key: Some(pki.server.1.clone().into_bytes()), client_auth: true, ..Default::default() };
        assert!(refuse(no_ca).contains("--link-tls-client-auth"));
        let not_pem = LinkTlsPem { ca: Some(b"not a certificate".to_vec()), ..Default::default() };
        assert!(refuse(not_pem).contains("no certificate"));
        let mismatched = LinkTlsPem { cert, key: Some(pki.client.1.clone().into_bytes()), ..Default::default() };
        assert!(LinkTls::from_pem(&mismatched).is_err(), "a key that is not the certificate's");
        let dir = std::env::temp_dir().join(format!("symphony-link-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.pem");
        std::fs::write(&big, vec![b'A'; MAX_PEM_FILE as usize + 1]).unwrap();
        let err = LinkTls::from_files(None, None, Some(&big), false).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("larger than"), "{err}");
        let err = LinkTls::from_files(None, None, Some(Path::new("/nonexistent/ca.pem")), false).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
