//! The codec's fuzz entry: whatever decodes re-encodes to the same bytes.

use super::*;

/// Entry point for fuzzers and property tests: decodes arbitrary bytes both
/// as one message and as a frame prefix, and checks that whatever decodes
/// re-encodes to the same bytes. Panics only on a real codec bug.
pub fn fuzz_decode(data: &[u8]) {
    let _ = frame_len(data);
    if let Some(p) = peek_peer(data) {
        let _ = p.to_string();
    }
    if let Ok(m) = decode(data) {
        match m {
            Message::Task(t) => fuzz_task_id(t.id()),
            Message::Cancel(c) => fuzz_task_id(c.id()),
            Message::BatchPlan(_, t) => t.iter().for_each(|e| fuzz_task_id(e.id())),
            Message::Completion(h, _) => fuzz_task_id(h.id()),
            Message::Dropped(d) => {
                fuzz_task_id(d.id());
                let r = DropReason::from_u32(d.reason).expect("decoded reasons are known");
                assert_eq!((r.code(), DropReason::ALL[r.index()]), (d.reason, r));
            }
            Message::Refused(r) => {
                let _ = r.to_string();
            }
            Message::Join(j) => {
                let _ = j.endpoint();
            }
            _ => {}
        }
        // A preamble message of another version decodes but re-encodes
        // with this version's header.
        let version = u16::from_le_bytes([data[4], data[5]]);
        if version != VERSION {
            assert!(matches!(m, Message::Challenge(_) | Message::Refused(_)), "{m:?}");
            return;
        }
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let n = match m {
            Message::Register(r) => encode(&mut buf, &r),
            Message::Heartbeat(r) => encode(&mut buf, &r),
            Message::Task(r) => encode(&mut buf, &r),
            Message::Cancel(r) => encode(&mut buf, &r),
            Message::BatchPlan(h, t) => {
                let mut w = BatchPlanWriter::new(&mut buf, &h).expect("room for a plan");
                for e in t.iter() {
                    w.push(&e).expect("decoded plans fit");
                }
                Ok(w.finish())
            }
            Message::Completion(h, inline) => encode_completion(&mut buf, &h, inline),
            Message::Dropped(r) => encode(&mut buf, &r),
            Message::BatchDone(r) => encode(&mut buf, &r),
            Message::ReadRequest(r) => encode(&mut buf, &r),
            Message::ReadResponse(r) => encode(&mut buf, &r),
            Message::Models(ids, busy) => {
                let ids: Vec<u32> = ids.iter().collect();
                let busy: Vec<GpuBusy> = busy.iter().collect();
                encode_models_busy(&mut buf, &ids, &busy)
            }
            Message::Challenge(r) => encode(&mut buf, &r),
            Message::Join(r) => encode(&mut buf, &r),
            Message::Welcome(r) => encode(&mut buf, &r),
            Message::Refused(r) => encode(&mut buf, &r),
            Message::BenchStamp(r) => encode(&mut buf, &r),
            Message::Drain(r) => encode(&mut buf, &r),
            Message::Tasks(list) => {
                let mut b = TaskBatcher::new(list.len());
                list.iter().for_each(|t| b.push(&t).expect("a decoded batch fits its own limit"));
                let m = b.take().expect("a decoded batch is not empty");
                buf[..m.len()].copy_from_slice(m);
                Ok(m.len())
            }
        }
        .expect("a decoded message re-encodes");
        assert_eq!(
            &buf[..n],
            data,
            "decode/encode round trip changed the bytes"
        );
    }
}

/// Any task id's fields rebuild it.
fn fuzz_task_id(id: TaskId) {
    assert_eq!(TaskId::new(id.frontend(), id.seq(), id.slot()), id);
}
