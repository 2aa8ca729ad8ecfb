//! One thread sleeping on several connections at once: a `WaitSet` over
//! the connections' `wait_fd`s wakes when any peer sends or leaves, on
//! every transport that has such an fd (shm, tcp io_uring, tcp blocking).

use dataplane::time::Duration;
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::TcpDomain;
use dataplane::transport::{Connection, Domain, Error, Listener};
use dataplane::waitset::WaitSet;
use dataplane::wire::{self, Heartbeat};

fn pair<D: Domain>(d: &D, addr: &str) -> (D::Conn, D::Conn) {
    let mut l = d.listen(addr).unwrap();
    let a = l.local_addr();
    let t = std::thread::spawn({
        let d = d.clone();
        move || d.connect(&a, Duration::from_millis(5000)).unwrap()
    });
    let server = l.accept(Duration::from_millis(5000)).unwrap();
    (server, t.join().unwrap())
}

fn wakes_on_any_of_several<D: Domain>(d: D, addr: &str) {
    let (mut s1, c1) = pair(&d, addr);
    let (mut s2, mut c2) = pair(&d, addr);
    let mut set = WaitSet::new().unwrap();
    set.add(s1.wait_fd().expect("an fd")).unwrap();
    set.add(s2.wait_fd().expect("an fd")).unwrap();
    let mut buf = [0u8; 64];
    // Poll first (arms receives), then nothing is pending: the wait times out.
    assert_eq!(s1.try_recv(&mut buf).unwrap(), None);
    assert_eq!(s2.try_recv(&mut buf).unwrap(), None);
    assert_eq!(set.wait(Duration::from_millis(20)), 0);

    let mut msg = [0u8; 64];
    let n = wire::encode(&mut msg, &Heartbeat { seq: 1, role: 4, id: 2 }).unwrap();
    c2.send(&msg[..n]).unwrap();
    c2.progress().unwrap();
    let t0 = std::time::Instant::now();
    let mut got = None;
    while got.is_none() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "no wake-up");
        set.wait(Duration::from_millis(1000));
        assert_eq!(s1.try_recv(&mut buf).unwrap(), None);
        got = s2.try_recv(&mut buf).unwrap();
    }
    assert_eq!(got, Some(n));

    // A departure wakes the set too, and is then reported.
    drop(c1);
    let t0 = std::time::Instant::now();
    loop {
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "departure not noticed");
        set.wait(Duration::from_millis(1000));
        match s1.try_recv(&mut buf) {
            Err(Error::PeerDisconnected) => break,
            Ok(None) => {}
            other => panic!("{other:?}"),
        }
    }
    let _ = (&mut c2, &mut s2);
}

#[test]
fn shm() {
    wakes_on_any_of_several(ShmDomain::new().unwrap(), "");
}

#[test]
fn tcp_blocking() {
    wakes_on_any_of_several(TcpDomain::blocking().unwrap(), "127.0.0.1:0");
}

#[test]
fn tcp_uring() {
    match TcpDomain::uring() {
        Ok(d) => wakes_on_any_of_several(d, "127.0.0.1:0"),
        Err(e) => eprintln!("io_uring unavailable here ({e}); the blocking engine is tested above"),
    }
}
