//! The fuzz targets' entry points on stable (seeded, so runs repeat): the
//! stream framing fed arbitrary bytes and arbitrary frames, READ requests
//! with arbitrary header fields, and shm ring records under a garbled ring
//! header. None may panic, and a link holding READs answers none (checked
//! inside `dataplane::transport::fuzz`).

use dataplane::transport::fuzz::{self, drive_socket, fuzz_key, FUZZ_REGION_LEN};
use dataplane::wire::{self, Header, Kind, ReadRequest, RemoteRef, HEADER_LEN, MAGIC, VERSION};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn runner(cases: u32) -> TestRunner {
    TestRunner::new_with_rng(
        Config { cases, failure_persistence: None, ..Config::default() },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[55u8; 32]),
    )
}

/// One frame: a header with any mix of valid and invalid fields, and a
/// body that may be shorter or longer than the header says.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    let version = prop_oneof![Just(VERSION), Just(VERSION - 1), Just(VERSION + 1), any::<u16>()];
    let kind = prop_oneof![Just(Kind::ReadRequest as u16), Just(Kind::ReadResponse as u16), 0u16..32];
    let body = proptest::collection::vec(any::<u8>(), 0..96);
    let len_choice = prop_oneof![Just(None), Just(Some(u32::MAX)), (0u32..128).prop_map(Some)];
    (version, kind, body, len_choice, any::<bool>()).prop_map(|(version, kind, body, len, magic)| {
        let h = Header {
            magic: if magic { MAGIC } else { 0x5359_4d51 },
            version,
            kind,
            len: len.unwrap_or(body.len() as u32),
            reserved: 0,
        };
        let mut f = bytemuck::bytes_of(&h).to_vec();
        f.extend_from_slice(&body);
        f
    })
}

/// A READ request that is valid but for the fields chosen.
fn read_request() -> impl Strategy<Value = Vec<u8>> {
    let key = prop_oneof![Just(fuzz_key().expect("a registered region")), any::<u32>()];
    let len = prop_oneof![0u32..(FUZZ_REGION_LEN as u32 + 8), any::<u32>()];
    let offset = prop_oneof![0u64..(FUZZ_REGION_LEN as u64 + 8), any::<u64>()];
    (key, len, offset).prop_map(|(key, len, offset)| {
        let req = ReadRequest { wr_id: 1, remote: RemoteRef { key, len, offset }, ..ReadRequest::default() };
        let mut buf = [0u8; 64];
        let n = wire::encode(&mut buf, &req).expect("encode");
        buf[..n].to_vec()
    })
}

#[test]
fn random_bytes_from_a_socket_peer_never_panic() {
    runner(256)
        .run(&proptest::collection::vec(any::<u8>(), 0..4096), |data| {
            fuzz::fuzz_stream(&data);
            Ok(())
        })
        .unwrap();
}

#[test]
fn sequences_of_malformed_and_valid_frames_never_panic() {
    let frames = proptest::collection::vec(prop_oneof![frame(), read_request()], 1..12);
    runner(256)
        .run(&(frames, any::<bool>()), |(frames, hold)| {
            let out = drive_socket(&frames.concat(), hold).expect("socket pair");
            prop_assert!(!hold || out.answered == 0);
            Ok(())
        })
        .unwrap();
}

#[test]
fn valid_read_requests_are_answered_only_within_the_region() {
    runner(256)
        .run(&read_request(), |req| {
            let out = drive_socket(&req, false).expect("socket pair");
            // A response head (16 + 16 bytes), plus the payload only when
            // the request lies inside the registered region.
            let remote: ReadRequest = bytemuck::pod_read_unaligned(&req[HEADER_LEN..]);
            let r = remote.remote;
            let inside = Some(r.key) == fuzz_key()
                && r.offset.checked_add(u64::from(r.len)).is_some_and(|end| end <= FUZZ_REGION_LEN as u64);
            let head = HEADER_LEN + 16;
            let want = if inside { head + r.len as usize } else { head };
            prop_assert_eq!(out.answered, want);
            prop_assert!(!out.closed);
            Ok(())
        })
        .unwrap();
}

#[test]
fn read_requests_with_arbitrary_headers_never_panic() {
    runner(512)
        .run(&proptest::collection::vec(any::<u8>(), 0..64), |data| {
            fuzz::fuzz_read_request(&data);
            Ok(())
        })
        .unwrap();
}

#[test]
fn shm_ring_records_and_garbled_ring_headers_never_panic() {
    let flags = prop_oneof![Just(0u8), any::<u8>()];
    let value = prop_oneof![Just(0u64), Just(u64::MAX), 0u64..8192, any::<u64>()];
    let records = proptest::collection::vec(prop_oneof![frame(), read_request()], 0..8);
    runner(256)
        .run(&(flags, value, records), |(flags, value, records)| {
            let mut data = vec![flags];
            data.extend_from_slice(&value.to_le_bytes());
            data.extend_from_slice(&records.concat());
            fuzz::fuzz_ring(&data);
            Ok(())
        })
        .unwrap();
}
