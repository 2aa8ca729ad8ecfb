//! The suite's leak check: a full session leaves nothing behind.

use super::*;

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn shm_files() -> usize {
    let prefix = "symphony-";
    let pid = format!("-{}-", std::process::id());
    let Ok(dir) = crate::mem::shm_dir() else { return 0 };
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with(prefix) && n.contains(&pid)
                })
                .count()
        })
        .unwrap_or(0)
}

/// A full session (connect, register, READ, message, deregister, drop)
/// leaves no fd, region, registration or shm file behind.
pub fn no_leaks<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    // Warm-up: lazily created process-wide state (e.g. a device list) is not a leak.
    let _ = f.domain().map(drop);
    let fds = fd_count();
    let regions = crate::mem::live_regions();
    let files = shm_files();
    {
        let Pair {
            owner_dom,
            reader_dom,
            mut owner,
            mut reader,
        } = pair(f);
        let (_src, src_reg) = source(f, &owner_dom, 1 << 20, 5);
        let (dst, dst_reg) = landing(f, &reader_dom, 1 << 20);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| serve(&mut owner, &stop));
            let ops: Vec<ReadOp> = (0..8u64)
                .map(|i| {
                    op(
                        i,
                        src_reg.remote_ref(i * 4096, 4096).unwrap(),
                        dst_reg.local_ref(i * 4096, 4096).unwrap(),
                    )
                })
                .collect();
            for c in read_all(&mut reader, &ops, until) {
                assert_eq!(c.status, Ok(()));
            }
            check_landed(&dst, 0, 5, 0, 4096, "READ in leak check");
            stop.store(true, Ordering::Release);
        });
        // The owner's last response may still be in flight: poll it out.
        crate::transport::deregister_within(&owner_dom, &src_reg, &mut [&mut owner], f.timeout())
            .expect("deregister source");
        crate::transport::deregister_within(&reader_dom, &dst_reg, &mut [&mut reader], f.timeout())
            .expect("deregister landing");
        assert_eq!(
            owner_dom.registered_count(),
            0,
            "{}: registrations left",
            f.name()
        );
        assert_eq!(
            reader_dom.registered_count(),
            0,
            "{}: registrations left",
            f.name()
        );
    }
    assert_eq!(
        crate::mem::live_regions(),
        regions,
        "{}: regions leaked",
        f.name()
    );
    assert_eq!(fd_count(), fds, "{}: fds leaked", f.name());
    assert_eq!(shm_files(), files, "{}: shm files leaked", f.name());
}
