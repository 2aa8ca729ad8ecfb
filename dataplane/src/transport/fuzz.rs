//! Entry points for the fuzz targets (`fuzz/fuzz_targets/`) and for the
//! property tests that run the same code on stable
//! (`dataplane/tests/hostile_props.rs`): the framed-stream engine fed
//! arbitrary bytes from a peer, over a socket (tcp's path: framing, inbox,
//! the READ responder) and over an shm ring whose header the peer may
//! also garble. Each must refuse what is not the protocol without a panic,
//! and a link that holds READs must answer none.
//!
//! Not a hot path: each call builds its own socket pair, buffers and ring
//! (~1 MiB), which is what a fuzz iteration may cost.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};

use memmap2::{MmapOptions, MmapRaw};

use super::registry::Registry;
use super::shm_ring::{self, RING_HEADER_LEN};
use super::stream::{ByteIo, Stream, StreamConfig};
use crate::mem::{Access, KeyTable, Region};
use crate::wire::{self, Header, Kind, ReadRequest, HEADER_LEN, MAGIC, MAX_MESSAGE_LEN, VERSION};

/// Bytes of the region a READ may reach (key [`fuzz_key`]).
pub const FUZZ_REGION_LEN: usize = 4096;
/// Polls of the stream per input: enough to drain any input a fuzzer
/// sends (each poll parses every whole frame received), bounded so that
/// no input can loop.
const MAX_POLLS: usize = 64;

/// One registry per process with one 4 KiB region registered for READs.
/// The registry, the region it keeps registered (kept alive here) and
/// that region's key.
type Registered = (Arc<Registry>, Arc<Region>, u32);

fn registered() -> Option<&'static Registered> {
    static REG: OnceLock<Option<Registered>> = OnceLock::new();
    REG.get_or_init(|| {
        let reg = Arc::new(Registry::new(KeyTable::new_local(4)));
        let region = Region::anonymous(FUZZ_REGION_LEN).ok()?;
        let key = reg.register(&region, Access::ALL, b"").ok()?.key();
        Some((reg, region, key))
    })
    .as_ref()
}

fn registry() -> Option<Arc<Registry>> {
    registered().map(|(r, _, _)| r.clone())
}

/// The key of the region registered in this process's fuzzed registry:
/// region keys are unguessable (`mem`), so it differs from process to
/// process and tests ask for it rather than assume one. `None` where no
/// region could be registered.
pub fn fuzz_key() -> Option<u32> {
    registered().map(|&(_, _, key)| key)
}

fn config(serve_reads: bool) -> StreamConfig {
    StreamConfig {
        max_outstanding: 16,
        max_read_len: FUZZ_REGION_LEN as u32,
        read_timeout: std::time::Duration::from_secs(5),
        serve_reads,
    }
}

/// What driving a stream saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Control messages handed to the owner.
    pub delivered: usize,
    /// Bytes the stream sent back to the peer (READ responses).
    pub answered: usize,
    /// The link was closed (bad bytes, or the peer left).
    pub closed: bool,
}

/// Polls `stream` as an owner does (`try_recv`, `progress`), draining what
/// it sends back through `peer`, until it is quiet, closed, or
/// [`MAX_POLLS`] passed.
fn drive(stream: &mut Stream, peer: &mut UnixStream) -> Outcome {
    let mut out = Outcome::default();
    let mut buf = vec![0u8; MAX_MESSAGE_LEN];
    let mut sink = vec![0u8; 64 * 1024];
    for _ in 0..MAX_POLLS {
        let mut busy = false;
        match stream.try_recv(&mut buf) {
            Ok(Some(n)) => {
                out.delivered += 1;
                busy = true;
                // What the owner does next: decode it (another version's
                // frame is refused there, not by the framing).
                let _ = buf.get(..n).map(wire::decode);
            }
            Ok(None) => {}
            Err(_) => {
                out.closed = true;
                break;
            }
        }
        if stream.progress().is_err() {
            out.closed = true;
            break;
        }
        while let Ok(n) = peer.read(&mut sink) {
            if n == 0 {
                break;
            }
            out.answered += n;
            busy = true;
        }
        if !busy && !stream.may_hold_input() {
            break;
        }
    }
    out
}

/// A socket stream (tcp's engine, `std` byte mover) fed `bytes` by its
/// peer. `hold_reads`: the link is an accepted one whose owner has not
/// allowed READs. Returns what the owner saw; `None` if the host could not
/// make a socket pair or a region.
pub fn drive_socket(bytes: &[u8], hold_reads: bool) -> Option<Outcome> {
    let registry = registry()?;
    let (mut peer, ours) = UnixStream::pair().ok()?;
    ours.set_nonblocking(true).ok()?;
    peer.set_nonblocking(true).ok()?;
    // The socket buffer takes a fuzz input whole; what does not fit is cut
    // (the framing sees a truncated frame, which is a case too).
    let mut sent = 0;
    while sent < bytes.len() {
        match peer.write(&bytes[sent..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => sent += n,
        }
    }
    let fd = OwnedFd::from(ours);
    let io = ByteIo::std(fd.as_raw_fd());
    let mut stream = Stream::new(fd, io, registry, config(true));
    if hold_reads {
        stream.hold_reads();
    }
    let out = drive(&mut stream, &mut peer);
    assert!(
        !hold_reads || out.answered == 0,
        "a link holding READs answered {} bytes",
        out.answered
    );
    Some(out)
}

/// Fuzz target `stream_frames`: arbitrary bytes from a tcp peer. The first
/// byte chooses whether the link holds READs (accepted, not registered).
pub fn fuzz_stream(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let _ = drive_socket(rest, mode & 1 == 1);
}

/// A READ request frame as the fuzzer shapes it: header fields taken from
/// `data` (version, length, reserved), then the rest as the body.
fn read_request_frame(data: &[u8]) -> Vec<u8> {
    let word = |i: usize| data.get(i..i + 2).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    let flags = data.first().copied().unwrap_or(0);
    let body = data.get(7..).unwrap_or(&[]);
    let version = if flags & 1 == 0 { VERSION } else { word(1) };
    let len = if flags & 2 == 0 {
        std::mem::size_of::<ReadRequest>() as u32
    } else {
        u32::from(word(3))
    };
    let header = Header {
        magic: MAGIC,
        version,
        kind: Kind::ReadRequest as u16,
        len,
        reserved: if flags & 4 == 0 { 0 } else { u32::from(word(5)) },
    };
    let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
    frame.extend_from_slice(bytemuck::bytes_of(&header));
    frame.extend_from_slice(body);
    frame
}

/// Fuzz target `read_request`: one READ request frame whose header (wire
/// version, length, reserved word) and body come from `data`, then the
/// same frame again, on a link that serves READs and on one that holds
/// them. Bit 3 of the first byte sends a Heartbeat first (a control
/// message the owner must see before a held READ is judged).
pub fn fuzz_read_request(data: &[u8]) {
    let frame = read_request_frame(data);
    let mut bytes = Vec::with_capacity(2 * frame.len() + 64);
    if data.first().is_some_and(|f| f & 8 != 0) {
        let mut hb = [0u8; 64];
        if let Ok(n) = wire::encode(&mut hb, &wire::Heartbeat { seq: 1, role: 4, id: 1 }) {
            bytes.extend_from_slice(&hb[..n]);
        }
    }
    bytes.extend_from_slice(&frame);
    bytes.extend_from_slice(&frame);
    let _ = drive_socket(&bytes, false);
    let _ = drive_socket(&bytes, true);
}

/// A fresh memory file of `len` bytes mapped twice (the two processes'
/// views of one shm ring file).
fn shared_pair(len: usize) -> Option<(MmapRaw, MmapRaw)> {
    // SAFETY: the name is a valid C string; the flags are defined.
    let fd = unsafe { libc::memfd_create(c"symphony-fuzz-ring".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned to us by memfd_create and is owned here.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(len as u64).ok()?;
    let a = MmapOptions::new().len(len).map_raw(&file).ok()?;
    let b = MmapOptions::new().len(len).map_raw(&file).ok()?;
    Some((a, b))
}

/// Header words of a ring (`shm_ring`'s layout: magic, capacity, then
/// tail and head each alone on 128 bytes).
const RING_CAPACITY_AT: usize = 8;
const RING_TAIL_AT: usize = 128;
const RING_HEAD_AT: usize = 256;

/// Fuzz target `shm_ring`: the peer's ring, laid out by an honest producer
/// that wrote `data[9..]` as records, then garbled by the peer as the
/// first byte says (bit 0: add `data[1..9]` to `tail`; bit 1: set `head` to
/// it; bit 2: set the capacity to it) before or after this side maps it
/// (bit 3). The consumer side and the stream behind it must refuse any of
/// it without a panic or a read outside the mapping.
pub fn fuzz_ring(data: &[u8]) {
    let flags = data.first().copied().unwrap_or(0);
    let value = data.get(1..9).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let records = data.get(9..).unwrap_or(&[]);
    let cap = shm_ring::MIN_RING_BYTES;
    let Some((producer_map, consumer_map)) = shared_pair(RING_HEADER_LEN + cap) else { return };
    let header = producer_map.as_mut_ptr();
    let Ok(mut producer) = shm_ring::init_producer(producer_map, cap) else { return };
    let _ = producer.write_parts(std::iter::once(&records[..records.len().min(cap)]));
    let garble = || {
        let word = |at: usize| {
            // SAFETY: `at + 8 <= RING_HEADER_LEN`, inside the mapping, and
            // 8-aligned (page-aligned base); the words are AtomicU64s.
            unsafe { &*(header.add(at) as *const std::sync::atomic::AtomicU64) }
        };
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        if flags & 1 != 0 {
            let t = word(RING_TAIL_AT).load(relaxed);
            word(RING_TAIL_AT).store(t.wrapping_add(value), relaxed);
        }
        if flags & 2 != 0 {
            word(RING_HEAD_AT).store(value, relaxed);
        }
        if flags & 4 != 0 {
            word(RING_CAPACITY_AT).store(value, relaxed);
        }
    };
    if flags & 8 == 0 {
        garble();
    }
    let Ok(consumer) = shm_ring::open_consumer(consumer_map) else { return };
    if flags & 8 != 0 {
        garble();
    }
    // Our own outgoing ring (the stream sends nothing on its own here).
    let Some((tx_map, _)) = shared_pair(RING_HEADER_LEN + cap) else { return };
    let Ok(tx) = shm_ring::init_producer(tx_map, cap) else { return };
    let Some(registry) = registry() else { return };
    let Ok((mut peer, ours)) = UnixStream::pair() else { return };
    if ours.set_nonblocking(true).is_err() || peer.set_nonblocking(true).is_err() {
        return;
    }
    let fd = OwnedFd::from(ours);
    let io = ByteIo::ring(fd.as_raw_fd(), tx, consumer);
    let mut stream = Stream::new(fd, io, registry, config(false));
    let _ = drive(&mut stream, &mut peer);
    // `producer` (and the peer's view of the header) outlive the stream.
    drop(stream);
    drop(producer);
}
