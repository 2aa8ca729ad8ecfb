//! Property tests of the wire codec: every message round-trips, and no
//! byte string makes the decoder panic (seeded, so runs are repeatable).

use dataplane::wire::{self, *};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn rref() -> impl Strategy<Value = RemoteRef> {
    (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(key, len, offset)| RemoteRef {
        key,
        len,
        offset,
    })
}

fn runner(cases: u32) -> TestRunner {
    let seed = [7u8; 32];
    TestRunner::new_with_rng(
        Config {
            cases,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
    )
}

#[derive(Debug, Clone)]
enum Msg {
    Register(u32, u32, u32, String),
    Heartbeat(Heartbeat),
    Task(Task),
    Plan(BatchPlanHead, Vec<BatchTask>),
    Completion(CompletionHead, Vec<u8>),
    Dropped(Dropped),
    BatchDone(BatchDone),
    ReadRequest(ReadRequest),
    ReadResponse(ReadResponse),
    Models(Vec<u32>),
}

fn msg() -> impl Strategy<Value = Msg> {
    let task = (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        rref(),
    )
        .prop_map(|(task_id, budget_ns, model_id, frontend_id, input)| Task {
            task_id,
            budget_ns,
            model_id,
            frontend_id,
            input,
            priority: (task_id >> 7) as u32 % 4,
            flags: (budget_ns & 1) as u32,
        });
    let btask =
        (any::<u64>(), any::<u32>(), rref(), any::<[u8; 16]>()).prop_map(|(task_id, frontend_id, input, capability)| BatchTask {
            task_id,
            frontend_id,
            queued_us: 0,
            input,
            capability,
        });
    let plan = (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(btask, 0..=MAX_BATCH_TASKS),
    )
        .prop_map(|(batch_id, exec_in_ns, model_id, gpu_id, t)| {
            Msg::Plan(
                BatchPlanHead {
                    batch_id,
                    exec_in_ns,
                    model_id,
                    gpu_id,
                    count: t.len() as u32,
                    run_ns: 0,
            epoch: 0,
                },
                t,
            )
        });
    let completion = (
        any::<u64>(),
        0u32..4,
        0u32..3,
        rref(),
        prop::collection::vec(any::<u8>(), 0..2048),
        (any::<u32>(), any::<[u8; 16]>()),
    )
        .prop_map(|(task_id, status, kind, remote, bytes, (backend_id, capability))| {
            // The execution fields, derived from the id: some executed
            // (size 1..=512, a valid position), some not (all zero).
            let batch_size = (task_id % 600) as u32 % 513;
            let mut h = CompletionHead {
                task_id,
                status,
                output_kind: kind,
                batch_size,
                batch_index: (task_id >> 12) as u32 % batch_size.max(1),
                input_ns: task_id.rotate_left(7) * u64::from(batch_size > 0),
                compute_ns: task_id.rotate_left(19) * u64::from(batch_size > 0),
                since_start_ns: task_id.rotate_left(31) * u64::from(batch_size > 0),
                backend_id,
                capability,
                ..Default::default()
            };
            let inline = match kind {
                1 => {
                    h.output_len = bytes.len() as u32;
                    bytes
                }
                2 => {
                    h.remote = remote;
                    h.output_len = remote.len;
                    Vec::new()
                }
                _ => Vec::new(),
            };
            Msg::Completion(h, inline)
        });
    prop_oneof![
        (1u32..=4, any::<u32>(), any::<u32>(), "[a-z0-9.:]{0,64}")
            .prop_map(|(r, i, c, e)| Msg::Register(r, i, c, e)),
        (any::<u64>(), 1u32..=4, any::<u32>())
            .prop_map(|(seq, role, id)| Msg::Heartbeat(Heartbeat { seq, role, id })),
        task.prop_map(Msg::Task),
        plan,
        completion,
        (any::<u64>(), 1u32..=DropReason::COUNT as u32).prop_map(|(task_id, reason)| Msg::Dropped(
            Dropped {
                task_id,
                reason,
                reserved: 0
            }
        )),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(batch_id, a, b, read_max_ns, gpu_id, count, reads)| Msg::BatchDone(BatchDone {
                batch_id,
                start_ago_ns: a.max(b),
                finish_ago_ns: a.min(b),
                read_max_ns,
                gpu_id,
                count,
                reads,
                reserved: 0,
            })
        ),
        (any::<u64>(), rref(), any::<u64>(), any::<[u8; 16]>()).prop_map(|(wr_id, remote, task, capability)| {
            Msg::ReadRequest(ReadRequest { wr_id, remote, task, capability })
        }),
        (any::<u64>(), 0u32..=5, any::<u32>()).prop_map(|(wr_id, status, len)| {
            Msg::ReadResponse(ReadResponse {
                wr_id,
                status,
                len: if status == 0 { len } else { 0 },
            })
        }),
        proptest::collection::btree_set(any::<u32>(), 0..64)
            .prop_map(|ids| Msg::Models(ids.into_iter().collect())),
    ]
}

fn encode_msg(m: &Msg, buf: &mut [u8]) -> usize {
    match m {
        Msg::Register(r, i, c, e) => {
            let role = Role::from_u32(*r).unwrap();
            wire::encode(buf, &Register::new(role, *i, *c, e))
        }
        Msg::Heartbeat(x) => wire::encode(buf, x),
        Msg::Task(x) => wire::encode(buf, x),
        Msg::Plan(h, t) => wire::encode_batch_plan(buf, h, t),
        Msg::Completion(h, b) => wire::encode_completion(buf, h, b),
        Msg::Dropped(x) => wire::encode(buf, x),
        Msg::BatchDone(x) => wire::encode(buf, x),
        Msg::ReadRequest(x) => wire::encode(buf, x),
        Msg::ReadResponse(x) => wire::encode(buf, x),
        Msg::Models(ids) => wire::encode_models(buf, ids),
    }
    .expect("valid messages encode")
}

#[test]
fn every_message_round_trips() {
    let buf = std::cell::RefCell::new(vec![0u8; MAX_MESSAGE_LEN + 1]);
    runner(512)
        .run(&msg(), |m| {
            let mut buf = buf.borrow_mut();
            let n = encode_msg(&m, &mut buf);
            prop_assert_eq!(wire::frame_len(&buf[..n]).unwrap(), Some(n));
            let d = wire::decode(&buf[..n]).expect("decodes");
            match (&m, d) {
                (Msg::Register(r, i, c, e), Message::Register(x)) => {
                    prop_assert_eq!(
                        (x.role, x.id, x.count, x.endpoint()),
                        (*r, *i, *c, e.as_str())
                    )
                }
                (Msg::Heartbeat(a), Message::Heartbeat(b)) => prop_assert_eq!(*a, b),
                (Msg::Task(a), Message::Task(b)) => prop_assert_eq!(*a, b),
                (Msg::Plan(h, t), Message::BatchPlan(dh, dt)) => {
                    prop_assert_eq!(*h, dh);
                    prop_assert!(dt.iter().eq(t.iter().copied()));
                }
                (Msg::Completion(h, b), Message::Completion(dh, db)) => {
                    prop_assert_eq!(*h, dh);
                    prop_assert_eq!(&b[..], db);
                }
                (Msg::Dropped(a), Message::Dropped(b)) => prop_assert_eq!(*a, b),
                (Msg::BatchDone(a), Message::BatchDone(b)) => prop_assert_eq!(*a, b),
                (Msg::ReadRequest(a), Message::ReadRequest(b)) => prop_assert_eq!(*a, b),
                (Msg::ReadResponse(a), Message::ReadResponse(b)) => prop_assert_eq!(*a, b),
                (Msg::Models(a), Message::Models(b, _)) => prop_assert!(b.iter().eq(a.iter().copied())),
                (a, b) => prop_assert!(false, "{:?} decoded as {:?}", a, b),
            }
            // Any strict prefix is refused, as is any extra byte.
            if n > 0 {
                prop_assert!(wire::decode(&buf[..n - 1]).is_err());
            }
            buf[n] = 0;
            prop_assert_eq!(wire::decode(&buf[..n + 1]), Err(WireError::TrailingBytes));
            wire::fuzz_decode(&buf[..n]);
            Ok(())
        })
        .unwrap();
}

#[test]
fn arbitrary_bytes_never_panic() {
    runner(4096)
        .run(&prop::collection::vec(any::<u8>(), 0..4096), |bytes| {
            wire::fuzz_decode(&bytes);
            Ok(())
        })
        .unwrap();
}

#[test]
fn mutated_valid_messages_never_panic() {
    // Valid header, corrupted body: reaches the deep validation paths.
    let strat = (msg(), any::<usize>(), any::<u8>(), any::<usize>());
    let buf = std::cell::RefCell::new(vec![0u8; MAX_MESSAGE_LEN]);
    runner(2048)
        .run(&strat, |(m, pos, val, cut)| {
            let mut buf = buf.borrow_mut();
            let n = encode_msg(&m, &mut buf);
            let mut v = buf[..n].to_vec();
            let p = pos % n;
            v[p] ^= val | 1;
            wire::fuzz_decode(&v);
            v.truncate(cut % (n + 1));
            wire::fuzz_decode(&v);
            Ok(())
        })
        .unwrap();
}

#[test]
fn task_id_fields_round_trip_over_their_full_ranges() {
    use dataplane::ids::{MAX_SLOTS, SEQ_MASK};
    let fields = (0..MAX_FRONTENDS, 0..=SEQ_MASK, 0..MAX_SLOTS);
    runner(4096)
        .run(&fields, |(f, s, i)| {
            let id = TaskId::new(f, s, i);
            prop_assert_eq!((id.frontend(), id.seq(), id.slot()), (f, s, i));
            prop_assert_eq!(TaskId::from(u64::from(id)), id);
            Ok(())
        })
        .unwrap();
}

#[test]
fn any_u64_decodes_to_in_range_fields_that_rebuild_it() {
    use dataplane::ids::{MAX_SLOTS, SEQ_MASK};
    runner(4096)
        .run(&any::<u64>(), |v| {
            let id = TaskId(v);
            prop_assert!(
                id.frontend() < MAX_FRONTENDS && id.seq() <= SEQ_MASK && id.slot() < MAX_SLOTS
            );
            prop_assert_eq!(TaskId::new(id.frontend(), id.seq(), id.slot()).get(), v);
            Ok(())
        })
        .unwrap();
}

#[test]
fn drop_reasons_have_distinct_codes_indices_and_names() {
    for (i, r) in DropReason::ALL.iter().enumerate() {
        assert_eq!(r.index(), i);
        assert_eq!(DropReason::from_u32(r.code()), Some(*r));
        assert!(DropReason::ALL[..i]
            .iter()
            .all(|o| o.as_str() != r.as_str()));
    }
    assert_eq!(DropReason::from_u32(0), None);
    assert_eq!(DropReason::from_u32(DropReason::COUNT as u32 + 1), None);
    assert_eq!(DropReason::from_u32(u32::MAX), None);
    // Codes that predate the shared enum keep their meaning.
    assert_eq!(DropReason::DeadlineUnmeetable.code(), 1);
    assert_eq!(DropReason::InputUnavailable.code(), 5);
}

/// The registration's messages (Challenge, Join, Welcome, Refused, and
/// version 1's Register) with any header version, any body length near
/// theirs and any bytes: never a panic; the frozen preamble kinds decode
/// whatever the version; `peek_peer` names any first message.
#[test]
fn handshake_messages_of_any_version_never_panic() {
    use std::mem::size_of;
    let strat = (
        prop::sample::select(vec![1u16, 11, 12, 13, 14]),
        prop_oneof![Just(wire::VERSION), Just(1u16), Just(wire::VERSION + 1), any::<u16>()],
        -9i64..9,
        prop::collection::vec(any::<u8>(), 300),
    );
    runner(4096)
        .run(&strat, |(kind, version, delta, body)| {
            let fixed = match kind {
                1 => size_of::<wire::Register>(),
                11 => size_of::<wire::Challenge>(),
                12 => size_of::<wire::Join>(),
                13 => size_of::<wire::Welcome>(),
                _ => size_of::<wire::Refused>(),
            };
            let len = (fixed as i64 + delta).max(0) as usize;
            let mut v = Vec::with_capacity(16 + len);
            v.extend_from_slice(&wire::MAGIC.to_le_bytes());
            v.extend_from_slice(&version.to_le_bytes());
            v.extend_from_slice(&kind.to_le_bytes());
            v.extend_from_slice(&(len as u32).to_le_bytes());
            v.extend_from_slice(&0u32.to_le_bytes());
            v.extend_from_slice(&body[..len]);
            wire::fuzz_decode(&v);
            let peek = wire::peek_peer(&v);
            prop_assert_eq!(peek.map(|p| (p.version, p.kind)), (len >= 8).then_some((version, kind)));
            let decoded = wire::decode(&v);
            if version != wire::VERSION {
                match (kind, delta, &decoded) {
                    (11, 0, Ok(Message::Challenge(_))) | (14, 0, Ok(Message::Refused(_))) => {}
                    (11 | 14, 0, other) => prop_assert!(false, "a frozen kind must decode: {:?}", other),
                    (_, _, Ok(m)) if delta != 0 || !matches!(kind, 11 | 14) => {
                        prop_assert!(false, "{:?} decoded from version {}", m, version)
                    }
                    _ => {}
                }
            }
            if let Ok(Message::Refused(r)) = decoded {
                let _ = r.to_string();
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_join_round_trips_and_its_mac_flag_must_match_its_mac() {
    let strat = (any::<u32>(), any::<u32>(), "[a-z0-9.:]{0,64}", any::<[u8; 32]>(), any::<bool>());
    runner(1024)
        .run(&strat, |(id, count, endpoint, mac, signed)| {
            let mut buf = vec![0u8; MAX_MESSAGE_LEN];
            let j = wire::Join::new(Role::Backend, id, count, &endpoint);
            let j = if signed { j.with_mac(mac) } else { j };
            let n = wire::encode(&mut buf, &j).unwrap();
            prop_assert_eq!(wire::decode(&buf[..n]), Ok(Message::Join(j)));
            // A MAC without the flag is refused.
            if !signed && mac != [0; 32] {
                let forged = wire::Join { mac, ..j };
                let n = wire::encode(&mut buf, &forged).unwrap();
                prop_assert_eq!(wire::decode(&buf[..n]), Err(WireError::ReservedNotZero));
            }
            Ok(())
        })
        .unwrap();
}
