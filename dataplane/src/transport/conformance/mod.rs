//! A conformance suite every transport runs unchanged, through a small
//! factory: connect, control messages, READs of 1 B .. 4 MiB with content
//! checks, batched and incast READs from several peer threads, rejected bad
//! READs, deregistration during READs, peer departure mid-READ, and no
//! leaks (regions, registrations, fds, shm files) after teardown.
//!
//! Every wait has a deadline; nothing sleeps to synchronise. The suite
//! functions panic with a message on a violation (they are test code) and
//! serialise themselves on a process-wide lock so that fd counts are exact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant as StdInstant;

use super::{Completion, Connection, Domain, Error, ErrorKind, Listener, ReadOp, Registration};
use crate::mem::{Access, LocalRef, Region, RemoteRef};
use crate::time::Duration;

mod leaks;
mod messages;
mod reads;

pub use leaks::no_leaks;
pub use messages::{
    connect_and_exchange, input_taken_in_by_a_send_is_reported, send_progress_counts,
    wait_fd_after_empty_recv, wait_fd_wakes,
};
pub use reads::{deregister_during_reads, disconnect_mid_read, incast, read_sizes, rejects_bad_reads};

/// Makes the domains and regions a transport needs.
pub trait TransportFactory: Sync {
    /// The transport's domain.
    type D: Domain;
    /// Name for messages.
    fn name(&self) -> String;
    /// A fresh domain (one per simulated process).
    fn domain(&self) -> Result<Self::D, Error>;
    /// What to pass to [`Domain::listen`] ("" = transport picks).
    fn listen_addr(&self) -> String {
        String::new()
    }
    /// A region this transport can register for remote READ and landing.
    fn region(&self, len: usize) -> Result<Arc<Region>, Error> {
        Ok(Region::anonymous(len)?)
    }
    /// Whether remote-access errors are told apart (bad key vs out of
    /// bounds vs deregistered) and leave the connection usable. Verbs
    /// report all as one remote access error and break the queue pair.
    fn precise_errors(&self) -> bool {
        true
    }
    /// Whether `send` blocks while the peer's buffers are full (the tcp
    /// blocking baseline) instead of queueing until `QueueFull`.
    fn sends_block(&self) -> bool {
        false
    }
    /// Bound for every wait in the suite.
    fn timeout(&self) -> Duration {
        Duration::from_millis(20_000)
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` while no suite check runs in this process: anything that opens
/// fds (a probe, a setup step) must not overlap a leak check's counts.
pub fn exclusive<T>(f: impl FnOnce() -> T) -> T {
    let _g = serial();
    f()
}

/// One `#[test]` per check of the suite, each running it with a factory:
/// `dataplane::conformance_tests!(factory)` in a transport's test file,
/// where `factory` is an `Option` of a [`TransportFactory`] (evaluated per
/// test; `None` skips, after the caller said why).
///
/// The checks are listed here once (the `@list` rule), so a check added to
/// the suite runs for every transport; the unit test
/// `every_public_check_is_listed` fails if one is left out.
#[macro_export]
macro_rules! conformance_tests {
    (@list $rule:ident $($arg:tt)*) => {
        $crate::conformance_tests! { @$rule $($arg)*;
            connect_and_exchange,
            read_sizes,
            incast,
            rejects_bad_reads,
            deregister_during_reads,
            disconnect_mid_read,
            no_leaks,
            wait_fd_wakes,
            wait_fd_after_empty_recv,
            input_taken_in_by_a_send_is_reported,
            send_progress_counts
        }
    };
    (@tests $factory:expr; $($check:ident),*) => {$(
        #[test]
        fn $check() {
            if let Some(f) = $factory {
                $crate::transport::conformance::$check(&f);
            }
        }
    )*};
    (@names; $($check:ident),*) => {
        [$(stringify!($check)),*]
    };
    ($factory:expr) => {
        $crate::conformance_tests!(@list tests $factory);
    };
}


// ---- helpers -----------------------------------------------------------------

/// Polite waiting for tests on small machines: yields, then short sleeps.
struct Idle(u32);

impl Idle {
    fn new() -> Self {
        Idle(0)
    }
    fn reset(&mut self) {
        self.0 = 0;
    }
    fn wait(&mut self) {
        self.0 += 1;
        if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

fn deadline<F: TransportFactory>(f: &F) -> StdInstant {
    StdInstant::now() + std::time::Duration::from_nanos(f.timeout().as_nanos())
}

fn pattern(seed: u8, i: u64) -> u8 {
    ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).wrapping_add(seed)
}

fn fill(region: &Region, seed: u8) {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    while (off as usize) < region.len() {
        let n = chunk.len().min(region.len() - off as usize);
        for (j, b) in chunk[..n].iter_mut().enumerate() {
            *b = pattern(seed, off + j as u64);
        }
        region.write_at(off, &chunk[..n]).expect("fill in bounds");
        off += n as u64;
    }
}

fn check_landed(landing: &Region, at: u64, seed: u8, src_off: u64, len: usize, what: &str) {
    let mut got = vec![0u8; len];
    landing.read_at(at, &mut got).expect("landing in bounds");
    if let Some(i) = (0..len).find(|&i| got[i] != pattern(seed, src_off + i as u64)) {
        panic!("{what}: byte {i} of {len} differs");
    }
}

struct Pair<D: Domain> {
    owner_dom: D,
    reader_dom: D,
    owner: D::Conn,
    reader: D::Conn,
}

/// The start of a check on a connected pair: the suite's lock, the
/// deadline of every wait, and the pair.
fn begin<F: TransportFactory>(f: &F) -> (MutexGuard<'static, ()>, StdInstant, Pair<F::D>) {
    let guard = serial();
    (guard, deadline(f), pair(f))
}

fn pair<F: TransportFactory>(f: &F) -> Pair<F::D> {
    let owner_dom = f.domain().expect("owner domain");
    let reader_dom = f.domain().expect("reader domain");
    let (owner, reader) = connect(f, &owner_dom, &reader_dom);
    Pair {
        owner_dom,
        reader_dom,
        owner,
        reader,
    }
}

/// (accepted side at `server`, connecting side at `client`).
fn connect<F: TransportFactory>(
    f: &F,
    server: &F::D,
    client: &F::D,
) -> (<F::D as Domain>::Conn, <F::D as Domain>::Conn) {
    let mut listener = server.listen(&f.listen_addr()).expect("listen");
    let addr = listener.local_addr();
    let t = f.timeout();
    // The accepting side is polled, as a daemon polls its links, until
    // the connect returns: a TLS client's connect handshakes with it.
    let connected = AtomicBool::new(false);
    std::thread::scope(|s| {
        let acc = s.spawn(|| {
            let mut a = listener.accept(t)?;
            while !connected.load(Ordering::Acquire) {
                let _ = a.progress();
                std::thread::yield_now();
            }
            Ok::<_, Error>(a)
        });
        let c = client.connect(&addr, t);
        connected.store(true, Ordering::Release);
        let c = c.unwrap_or_else(|e| panic!("{}: connect {addr}: {e}", f.name()));
        let mut a = acc
            .join()
            .expect("accept thread")
            .unwrap_or_else(|e| panic!("{}: accept: {e}", f.name()));
        // The accepted side owns the memory here: it lets the peer READ,
        // as a frontend does once a backend registered on its data port.
        a.allow_remote_reads();
        (a, c)
    })
}

/// Drives `conn` (serving its peer's READs) until `stop`.
fn serve<C: Connection>(conn: &mut C, stop: &AtomicBool) {
    let mut idle = Idle::new();
    while !stop.load(Ordering::Acquire) {
        if conn.progress().is_err() {
            break;
        }
        idle.wait();
        if idle.0 > 1000 {
            idle.reset();
        }
    }
}

fn send_retry<C: Connection>(
    conn: &mut C,
    msg: &[u8],
    other: &mut impl FnMut(),
    until: StdInstant,
) {
    let mut idle = Idle::new();
    loop {
        match conn.send(msg) {
            Ok(()) => return,
            Err(Error::QueueFull) => {}
            Err(e) => panic!("send: {e}"),
        }
        let _ = conn.progress();
        other();
        assert!(
            StdInstant::now() < until,
            "send did not drain before the deadline"
        );
        idle.wait();
    }
}

fn recv_one<C: Connection>(
    conn: &mut C,
    buf: &mut [u8],
    other: &mut impl FnMut(),
    until: StdInstant,
) -> usize {
    let mut idle = Idle::new();
    loop {
        match conn.try_recv(buf) {
            Ok(Some(n)) => return n,
            Ok(None) => {}
            Err(e) => panic!("try_recv: {e}"),
        }
        other();
        assert!(StdInstant::now() < until, "no message before the deadline");
        idle.wait();
    }
}

/// Posts all `ops` (retrying on QueueFull) and collects their completions.
fn read_all<C: Connection>(conn: &mut C, ops: &[ReadOp], until: StdInstant) -> Vec<Completion> {
    let mut out = Vec::with_capacity(ops.len());
    let mut buf = [Completion::default(); 64];
    let mut next = 0;
    let mut idle = Idle::new();
    while out.len() < ops.len() {
        if next < ops.len() {
            match conn.post_reads(&ops[next..]) {
                Ok(n) => next += n,
                Err(Error::QueueFull) => {}
                Err(e) => panic!("post_reads: {e}"),
            }
        }
        let n = conn.poll_completions(&mut buf).expect("poll_completions");
        out.extend_from_slice(&buf[..n]);
        if n == 0 {
            assert!(
                StdInstant::now() < until,
                "READs not completed before the deadline ({} of {})",
                out.len(),
                ops.len()
            );
            idle.wait();
        } else {
            idle.reset();
        }
    }
    out
}

/// One READ whose outcome may be an error (at post or in the completion).
fn read_outcome<C: Connection>(
    conn: &mut C,
    op: &ReadOp,
    until: StdInstant,
) -> Result<u32, ErrorKind> {
    if let Err(e) = conn.post_read(op) {
        return Err(e.kind());
    }
    let mut buf = [Completion::default(); 4];
    let mut idle = Idle::new();
    loop {
        let n = conn.poll_completions(&mut buf).expect("poll_completions");
        if n > 0 {
            assert_eq!(n, 1);
            assert_eq!(buf[0].wr_id, op.wr_id);
            return buf[0].status.map(|_| buf[0].bytes);
        }
        assert!(
            StdInstant::now() < until,
            "READ outcome not reported before the deadline"
        );
        idle.wait();
    }
}

fn landing<D: Domain, F: TransportFactory<D = D>>(
    f: &F,
    d: &D,
    len: usize,
) -> (Arc<Region>, Registration) {
    let r = f.region(len).expect("landing region");
    let reg = d
        .register(&r, Access::LOCAL_WRITE)
        .expect("register landing");
    (r, reg)
}

fn source<D: Domain, F: TransportFactory<D = D>>(
    f: &F,
    d: &D,
    len: usize,
    seed: u8,
) -> (Arc<Region>, Registration) {
    let r = f.region(len).expect("source region");
    fill(&r, seed);
    let reg = d
        .register(&r, Access::REMOTE_READ)
        .expect("register source");
    (r, reg)
}

fn op(wr_id: u64, remote: RemoteRef, local: LocalRef) -> ReadOp {
    ReadOp {
        wr_id,
        remote,
        local,
    }
}

fn is_access_error(k: ErrorKind) -> bool {
    matches!(
        k,
        ErrorKind::BadKey
            | ErrorKind::OutOfBounds
            | ErrorKind::Deregistered
            | ErrorKind::AccessDenied
    )
}

#[cfg(test)]
mod tests {
    /// Every public check (`pub fn name<F: TransportFactory>(f: &F)`) of
    /// the suite's files is in the list `conformance_tests!` expands.
    #[test]
    fn every_public_check_is_listed() {
        let mut listed = crate::conformance_tests!(@list names).to_vec();
        let mut defined: Vec<&str> = [include_str!("messages.rs"), include_str!("reads.rs"), include_str!("leaks.rs")]
            .iter()
            .flat_map(|src| src.lines())
            .filter_map(|line| line.strip_prefix("pub fn "))
            .filter(|rest| rest.contains("<F: TransportFactory>(f: &F)"))
            .filter_map(|rest| rest.split('<').next())
            .collect();
        assert!(defined.len() >= 11, "the scan found the checks: {defined:?}");
        listed.sort_unstable();
        defined.sort_unstable();
        assert_eq!(listed, defined);
    }
}
