//! `symphony up --serve --tls-cert/--tls-key` hands the identity to its
//! frontends: they come up serving HTTPS (issue 16).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn up_serves_https_with_the_given_identity() {
    let bin = env!("CARGO_BIN_EXE_symphony");
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls");
    let mut up = Command::new(bin)
        .args(["up", "--serve", "--models", "ResNet50", "--backends", "1", "--frontends", "1", "--max-queue", "64"])
        .arg("--tls-cert")
        .arg(tls.join("cert.pem"))
        .arg("--tls-key")
        .arg(tls.join("key.pem"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("up starts");
    let mut lines = BufReader::new(up.stdout.take().expect("stdout")).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut addr = None;
    loop {
        let line = lines.next().expect("up prints its addresses").expect("utf-8");
        if let Some(a) = line.strip_prefix("frontend 1: ") {
            addr = Some(a.to_string());
        }
        if line.starts_with("serving") {
            break;
        }
        assert!(Instant::now() < deadline, "up --serve did not come up");
    }
    let addr = addr.expect("the frontend's address");
    let host = addr.strip_prefix("https://").unwrap_or_else(|| panic!("not HTTPS: {addr}"));
    // A plain-HTTP request to the TLS port gets no HTTP answer.
    let mut s = std::net::TcpStream::connect(host).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).unwrap_or(0);
    assert!(!buf[..n].starts_with(b"HTTP/1.1 200"), "plain HTTP was served on the TLS port");
    // SAFETY: sends SIGINT to the child process this test started.
    unsafe { libc::kill(up.id() as libc::pid_t, libc::SIGINT) };
    let status = up.wait().expect("up exits");
    assert!(status.success(), "{status:?}");
}
