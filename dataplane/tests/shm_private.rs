//! Shared-memory files are private to their user (issue 55 item 4): every
//! file this process creates for the shm transport (staging regions, the
//! key-table registry) is mode 0600 and lies in a directory of mode 0700
//! owned by this user, whatever the umask. Its own test binary: the umask
//! is process-wide.

use std::os::unix::fs::MetadataExt;

use dataplane::mem::Region;
use dataplane::time::Duration;
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::{Domain, Listener};

#[test]
fn shm_files_are_0600_in_a_0700_directory_even_under_umask_0() {
    // SAFETY: umask only changes this process's file-creation mask; this
    // binary holds this one test, so no other test's files are affected.
    unsafe { libc::umask(0) };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let region = Region::shared(8192).expect("shared region");
    let path = region.shm_path().expect("a file").to_path_buf();
    let dir = path.parent().expect("a directory").to_path_buf();

    // A domain with a connection: its registry file, its rings (unlinked
    // once mapped), and a registered region.
    let owner = ShmDomain::new().expect("domain");
    let reader = ShmDomain::new().expect("domain");
    let _reg = owner.register(&region, dataplane::mem::Access::REMOTE_READ).expect("register");
    let mut listener = owner.listen("").expect("listen");
    let addr = listener.local_addr();
    let (_a, _c) = std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(Duration::from_millis(10_000)).expect("accept"));
        let c = reader.connect(&addr, Duration::from_millis(10_000)).expect("connect");
        (acc.join().expect("accept thread"), c)
    });

    let d = std::fs::symlink_metadata(&dir).expect("directory");
    assert!(d.file_type().is_dir(), "{} is a real directory", dir.display());
    assert_eq!(d.mode() & 0o777, 0o700, "{}: mode {:o}", dir.display(), d.mode() & 0o777);
    assert_eq!(d.uid(), me, "{} is ours", dir.display());

    let pid = format!("-{}-", std::process::id());
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).expect("list").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("symphony-") || !name.contains(&pid) {
            continue;
        }
        let m = e.metadata().expect("metadata");
        assert_eq!(m.mode() & 0o777, 0o600, "{name}: mode {:o}", m.mode() & 0o777);
        assert_eq!(m.uid(), me, "{name} is ours");
        seen += 1;
    }
    // The region and two registries at least.
    assert!(seen >= 3, "only {seen} files of this process in {}", dir.display());
}
