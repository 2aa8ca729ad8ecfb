//! The suite's READ checks: sizes, incast, refused READs, deregistration
//! and departure while READs are in flight.

use std::sync::atomic::AtomicUsize;

use super::*;

const SIZES: [usize; 9] = [1, 2, 63, 64, 4096, 4097, 150 * 1024, 1 << 20, 4 << 20];

/// READs of 1 B .. 4 MiB at odd offsets, one at a time and batched.
pub fn read_sizes<F: TransportFactory>(f: &F) {
    let (_g, until, Pair { owner_dom, reader_dom, mut owner, mut reader }) = begin(f);
    let src_len = 8 << 20;
    let (_src, src_reg) = source(f, &owner_dom, src_len, 7);
    let (dst, dst_reg) = landing(f, &reader_dom, src_len);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| serve(&mut owner, &stop));
        for (i, &len) in SIZES.iter().enumerate() {
            let off = ((len * 7 + 13 * i) % (src_len - len)) as u64;
            let at = ((len * 3 + 5 * i) % (src_len - len)) as u64;
            let o = op(
                i as u64,
                src_reg.remote_ref(off, len as u32).unwrap(),
                dst_reg.local_ref(at, len as u32).unwrap(),
            );
            let c = read_all(&mut reader, &[o], until);
            assert_eq!(c[0].status, Ok(()), "{}: READ of {len} B", f.name());
            assert_eq!((c[0].wr_id, c[0].bytes as usize), (i as u64, len));
            check_landed(
                &dst,
                at,
                7,
                off,
                len,
                &format!("{}: READ of {len} B", f.name()),
            );
        }
        // A batch, all posted at once.
        let ops: Vec<ReadOp> = (0..200u64)
            .map(|i| {
                let len = 1000 + (i as u32 * 37) % 3000;
                let off = i * 4099;
                op(
                    1000 + i,
                    src_reg.remote_ref(off, len).unwrap(),
                    dst_reg.local_ref(i * 4096, len).unwrap(),
                )
            })
            .collect();
        let cs = read_all(&mut reader, &ops, until);
        for c in &cs {
            assert_eq!(c.status, Ok(()), "{}: batched READ", f.name());
            let i = c.wr_id - 1000;
            let o = &ops[i as usize];
            assert_eq!(c.bytes, o.remote.len);
            check_landed(
                &dst,
                i * 4096,
                7,
                o.remote.offset - src_reg.addr_base(),
                o.remote.len as usize,
                "batched READ",
            );
        }
        let mut ids: Vec<u64> = cs.iter().map(|c| c.wr_id).collect();
        ids.sort_unstable();
        assert!(
            ids.iter().copied().eq(1000..1200),
            "every batched READ completes once"
        );
        stop.store(true, Ordering::Release);
    });
}

/// One reader READs from several owners at once (each owner served by its
/// own thread), and several reader threads READ one owner at once.
pub fn incast<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    const OWNERS: usize = 3;
    const PER: u64 = 48;
    const LEN: u32 = 24 * 1024;
    let reader_dom = f.domain().expect("reader domain");
    let (dst, dst_reg) = landing(f, &reader_dom, OWNERS * PER as usize * LEN as usize);
    let mut owners = Vec::new();
    for k in 0..OWNERS {
        let d = f.domain().expect("owner domain");
        let (src, reg) = source(f, &d, PER as usize * LEN as usize + 4096, 40 + k as u8);
        let (oc, rc) = connect(f, &d, &reader_dom);
        owners.push((d, src, reg, oc, rc));
    }
    let (od, oreg) = (owners[0].0.clone(), owners[0].2.clone());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut readers = Vec::new();
        for (_, _, reg, oc, rc) in owners.iter_mut() {
            let stop = &stop;
            s.spawn(move || serve(oc, stop));
            readers.push((rc, reg.clone()));
        }
        // Post everything to every owner first (the incast), then poll all.
        let mut expected = 0;
        let mut posted = [0u64; OWNERS];
        let mut done = 0;
        let mut buf = [Completion::default(); 32];
        let mut idle = Idle::new();
        let total = OWNERS as u64 * PER;
        while done < total {
            for (k, (rc, reg)) in readers.iter_mut().enumerate() {
                while posted[k] < PER {
                    let i = posted[k];
                    let slot = k as u64 * PER + i;
                    let o = op(
                        slot,
                        reg.remote_ref(i * LEN as u64 + 1, LEN).unwrap(),
                        dst_reg.local_ref(slot * LEN as u64, LEN).unwrap(),
                    );
                    match rc.post_read(&o) {
                        Ok(()) => posted[k] += 1,
                        Err(Error::QueueFull) => break,
                        Err(e) => panic!("{}: incast post: {e}", f.name()),
                    }
                }
                let n = rc.poll_completions(&mut buf).expect("poll");
                for c in &buf[..n] {
                    assert_eq!(c.status, Ok(()), "{}: incast READ {}", f.name(), c.wr_id);
                    let (owner, i) = (c.wr_id / PER, c.wr_id % PER);
                    assert_eq!(owner as usize, k, "completion on the right connection");
                    check_landed(
                        &dst,
                        c.wr_id * LEN as u64,
                        40 + k as u8,
                        i * LEN as u64 + 1,
                        LEN as usize,
                        "incast READ",
                    );
                    expected += 1;
                }
                done += n as u64;
                if n > 0 {
                    idle.reset();
                }
            }
            assert!(
                StdInstant::now() < until,
                "{}: incast stalled at {done}/{total}",
                f.name()
            );
            idle.wait();
        }
        assert_eq!(expected, total);

        several_readers_one_owner(f, &od, &oreg, until);
        stop.store(true, Ordering::Release);
    });
}

/// Several reader threads READ one owner domain (`od`, whose region
/// `oreg` holds seed 40) at once, each over its own connection.
fn several_readers_one_owner<F: TransportFactory>(f: &F, od: &F::D, oreg: &Registration, until: StdInstant) {
    let mut pairs = Vec::new();
    for _ in 0..2 {
        let rd = f.domain().expect("reader domain");
        let (l, lreg) = landing(f, &rd, 64 * 4096);
        let (oc, rc) = connect(f, od, &rd);
        pairs.push((rd, l, lreg, oc, rc));
    }
    let stop2 = AtomicBool::new(false);
    std::thread::scope(|s2| {
        let mut hs = Vec::new();
        for (_, l, lreg, oc, rc) in pairs.iter_mut() {
            let stop2 = &stop2;
            s2.spawn(move || serve(oc, stop2));
            let oreg = oreg.clone();
            let lreg = lreg.clone();
            let l = l.clone();
            hs.push(s2.spawn(move || {
                let ops: Vec<ReadOp> = (0..64u64)
                    .map(|i| {
                        op(
                            i,
                            oreg.remote_ref(i * 512, 4096).unwrap(),
                            lreg.local_ref(i * 4096, 4096).unwrap(),
                        )
                    })
                    .collect();
                for c in read_all(rc, &ops, until) {
                    assert_eq!(c.status, Ok(()));
                    check_landed(
                        &l,
                        c.wr_id * 4096,
                        40,
                        c.wr_id * 512,
                        4096,
                        "concurrent readers",
                    );
                }
            }));
        }
        for h in hs {
            h.join().expect("reader thread");
        }
        stop2.store(true, Ordering::Release);
    });
}

/// Bad key, out of bounds, deregistered and too-long READs are refused
/// with an error, never served; a precise transport also names the error
/// and keeps the connection usable.
pub fn rejects_bad_reads<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    let cases: [&str; 4] = [
        "bad key",
        "out of bounds",
        "deregistered",
        "landing too small",
    ];
    for (ci, case) in cases.iter().enumerate() {
        let Pair { owner_dom, reader_dom, mut owner, mut reader } = pair(f);
        let (_src, src_reg) = source(f, &owner_dom, 64 * 1024, 3);
        let (dst, dst_reg) = landing(f, &reader_dom, 64 * 1024);
        let good = src_reg.remote_ref(0, 4096).unwrap();
        let remote = bad_remote(f, ci, good, &owner_dom);
        let local = if ci == 3 {
            dst_reg.local_ref(0, 100).unwrap()
        } else {
            dst_reg.local_ref(0, 4096).unwrap()
        };
        // Poison the landing area: a refused READ must not write it.
        dst.write_at(0, &[0x5a; 4096]).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| serve(&mut owner, &stop));
            let r = read_outcome(&mut reader, &op(ci as u64, remote, local), until);
            let k = match r {
                Ok(_) => panic!("{}: {case} READ was served", f.name()),
                Err(k) => k,
            };
            if ci == 3 {
                assert!(
                    matches!(k, ErrorKind::OutOfBounds | ErrorKind::TooLarge) || is_access_error(k),
                    "{case}: {k:?}"
                );
            } else {
                assert!(is_access_error(k), "{}: {case}: got {k:?}", f.name());
            }
            let mut b = [0u8; 4096];
            dst.read_at(0, &mut b).unwrap();
            assert!(
                b.iter().all(|&x| x == 0x5a),
                "{}: {case}: refused READ wrote the landing buffer",
                f.name()
            );
            if f.precise_errors() {
                let want = precise_refusal(ci);
                assert!(
                    want.contains(&k),
                    "{}: {case}: got {k:?}, want {want:?}",
                    f.name()
                );
                let again = read_outcome(
                    &mut reader,
                    &op(99, good, dst_reg.local_ref(0, 4096).unwrap()),
                    until,
                );
                assert_eq!(
                    again,
                    Ok(4096),
                    "{}: connection unusable after {case}",
                    f.name()
                );
                check_landed(&dst, 0, 3, 0, 4096, "READ after a refused one");
                refuses_over_max_read_len(f, &mut reader, &reader_dom, (good, local), until);
            }
            stop.store(true, Ordering::Release);
        });
    }
}

/// The remote side of bad READ case `ci` of [`rejects_bad_reads`], made
/// from `good` (a valid 4 KiB reference into a 64 KiB region of
/// `owner_dom`): a wrong key, a range past the region's end, a region
/// deregistered since, or (case 3, whose landing is too small) `good`.
fn bad_remote<F: TransportFactory>(f: &F, ci: usize, good: RemoteRef, owner_dom: &F::D) -> RemoteRef {
    match ci {
        0 => RemoteRef {
            key: good.key ^ 0x0001_0000,
            ..good
        },
        1 => RemoteRef {
            offset: good.offset + 64 * 1024 - 10,
            len: 20,
            ..good
        },
        2 => {
            let (_r2, reg2) = source(f, owner_dom, 8192, 1);
            let rr = reg2.remote_ref(0, 4096).unwrap();
            owner_dom
                .deregister(&reg2)
                .expect("idle deregistration succeeds");
            rr
        }
        _ => good,
    }
}

/// The errors a precise transport may name for bad READ case `ci`.
fn precise_refusal(ci: usize) -> &'static [ErrorKind] {
    match ci {
        0 => &[ErrorKind::BadKey],
        1 => &[ErrorKind::OutOfBounds],
        2 => &[ErrorKind::BadKey, ErrorKind::Deregistered],
        _ => &[ErrorKind::OutOfBounds],
    }
}

/// A READ one byte longer than the transport's `max_read_len` (when it has
/// one), from `good` into `local` stretched to match, is refused.
fn refuses_over_max_read_len<F: TransportFactory, C: Connection>(
    f: &F,
    reader: &mut C,
    reader_dom: &F::D,
    (good, local): (RemoteRef, LocalRef),
    until: StdInstant,
) {
    let max = reader_dom.max_read_len();
    if max < u32::MAX {
        let big = RemoteRef {
            len: max + 1,
            ..good
        };
        let long_local = LocalRef {
            len: max + 1,
            ..local
        };
        let r = read_outcome(reader, &op(100, big, long_local), until);
        assert!(r.is_err(), "{}: READ over max_read_len accepted", f.name());
    }
}

/// The owner deregisters a region while READs of it are in flight: each
/// READ either lands intact or fails with an access error, nothing hangs,
/// and the owner unmaps the region as soon as deregistration succeeds (a
/// transport touching it afterwards would crash the test).
pub fn deregister_during_reads<F: TransportFactory>(f: &F) {
    let (_g, until, Pair { owner_dom, reader_dom, mut owner, mut reader }) = begin(f);
    let len: u32 = 1 << 20;
    let count = reader.max_outstanding_reads().min(16) as u64;
    let (src, src_reg) = source(f, &owner_dom, len as usize * count as usize, 11);
    let (dst, dst_reg) = landing(f, &reader_dom, len as usize * count as usize);
    let ops: Vec<ReadOp> = (0..count)
        .map(|i| {
            op(
                i,
                src_reg.remote_ref(i * len as u64, len).unwrap(),
                dst_reg.local_ref(i * len as u64, len).unwrap(),
            )
        })
        .collect();
    let posted = reader.post_reads(&ops).expect("post");
    let served_src = Mutex::new(Some(src));
    let reader_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut idle = Idle::new();
            loop {
                match owner_dom.deregister(&src_reg) {
                    Ok(()) => break,
                    Err(Error::Busy) => {}
                    Err(e) => panic!("deregister: {e}"),
                }
                let _ = owner.progress();
                assert!(StdInstant::now() < until, "deregistration stayed Busy");
                idle.wait();
            }
            // Unmap now: any later access by a transport would fault.
            served_src.lock().unwrap_or_else(|p| p.into_inner()).take();
            serve(&mut owner, &reader_done);
        });
        let mut got = 0;
        let mut buf = [Completion::default(); 32];
        let mut idle = Idle::new();
        while got < posted {
            let n = reader.poll_completions(&mut buf).expect("poll");
            for c in &buf[..n] {
                match c.status {
                    Ok(()) => check_landed(
                        &dst,
                        c.wr_id * len as u64,
                        11,
                        c.wr_id * len as u64,
                        len as usize,
                        "READ racing deregistration",
                    ),
                    Err(k) => assert!(
                        is_access_error(k),
                        "{}: READ racing deregistration failed with {k:?}",
                        f.name()
                    ),
                }
            }
            got += n;
            assert!(
                StdInstant::now() < until,
                "{}: READs racing deregistration hung",
                f.name()
            );
            idle.wait();
        }
        reader_done.store(true, Ordering::Release);
    });
    // After deregistration: refused.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| serve(&mut owner, &stop));
        let r = read_outcome(&mut reader, &ops[0], until);
        assert!(
            matches!(r, Err(k) if is_access_error(k)),
            "{}: READ after deregistration: {r:?}",
            f.name()
        );
        stop.store(true, Ordering::Release);
    });
}

/// The owner goes away (connection, domain and memory) while READs are
/// outstanding: every posted READ completes exactly once, successfully or
/// with an error, new READs are refused, and nothing hangs or panics.
pub fn disconnect_mid_read<F: TransportFactory>(f: &F) {
    let (_g, until, Pair { owner_dom, reader_dom, owner, mut reader }) = begin(f);
    let len: u32 = 256 * 1024;
    let (src, src_reg) = source(f, &owner_dom, 4 << 20, 21);
    let (dst, dst_reg) = landing(f, &reader_dom, 64 * len as usize);
    let completed = AtomicUsize::new(0);
    let owner_box = Mutex::new(Some((owner, owner_dom, src)));
    std::thread::scope(|s| {
        s.spawn(|| leave_after_four_reads(&owner_box, &completed, until));
        let window = reader.max_outstanding_reads().min(16);
        let mut next_id = 0u64;
        let mut seen = vec![false; 0];
        let mut error_seen = false;
        let mut refused = false;
        let mut buf = [Completion::default(); 32];
        let mut idle = Idle::new();
        loop {
            if !refused && reader.outstanding_reads() < window {
                let slot = next_id % 64;
                let o = op(
                    next_id,
                    src_reg
                        .remote_ref((next_id % 16) * len as u64, len)
                        .unwrap(),
                    dst_reg.local_ref(slot * len as u64, len).unwrap(),
                );
                match reader.post_read(&o) {
                    Ok(()) => {
                        next_id += 1;
                        seen.push(false);
                    }
                    Err(Error::QueueFull) => {}
                    Err(_) => refused = true,
                }
            }
            let n: usize = reader.poll_completions(&mut buf).unwrap_or_default();
            for c in &buf[..n] {
                let i = c.wr_id as usize;
                assert!(
                    i < seen.len() && !seen[i],
                    "{}: completion {i} unknown or repeated",
                    f.name()
                );
                seen[i] = true;
                match c.status {
                    Ok(()) => {
                        check_landed(
                            &dst,
                            (c.wr_id % 64) * len as u64,
                            21,
                            (c.wr_id % 16) * len as u64,
                            len as usize,
                            "READ before departure",
                        );
                        completed.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(_) => error_seen = true,
                }
            }
            if (error_seen || refused) && reader.outstanding_reads() == 0 {
                break;
            }
            assert!(
                StdInstant::now() < until,
                "{}: departure not reported ({} outstanding)",
                f.name(),
                reader.outstanding_reads()
            );
            if n == 0 {
                idle.wait();
            } else {
                idle.reset();
            }
        }
        assert!(
            seen.iter().all(|&x| x),
            "{}: a posted READ never completed",
            f.name()
        );
        // Eventually refused for good.
        let probe = op(1 << 40, src_reg.remote_ref(0, 64).unwrap(), dst_reg.local_ref(0, 64).unwrap());
        refused_for_good(f, &mut reader, &probe, until);
    });
    let _ = reader.progress();
    assert!(
        !reader.is_connected() || reader.try_recv(&mut [0u8; 64]).is_err(),
        "{}: departure not visible",
        f.name()
    );
}

/// The owner's side of [`disconnect_mid_read`]: serves until the reader
/// has 4 READs back, then leaves (connection, domain and memory) while
/// READs are still outstanding.
fn leave_after_four_reads<C: Connection, D>(owner_box: &Mutex<Option<(C, D, Arc<Region>)>>, completed: &AtomicUsize, until: StdInstant) {
    let (mut owner, dom, src) = owner_box.lock().unwrap().take().unwrap();
    let mut idle = Idle::new();
    while completed.load(Ordering::Acquire) < 4 {
        let _ = owner.progress();
        assert!(StdInstant::now() < until, "reader made no progress");
        idle.wait();
    }
    drop(owner);
    drop(dom);
    drop(src);
}

/// Retries `probe` until the departed owner's READs are refused.
fn refused_for_good<F: TransportFactory, C: Connection>(f: &F, reader: &mut C, probe: &ReadOp, until: StdInstant) {
    let mut idle = Idle::new();
    while read_outcome(reader, probe, until).is_ok() {
        assert!(
            StdInstant::now() < until,
            "{}: READs still served after the owner left",
            f.name()
        );
        idle.wait();
    }
}
