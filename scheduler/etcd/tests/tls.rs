//! The client over TLS with client-certificate authentication, against a
//! real etcd (Debian's etcd-server, installed by scripts/setup.sh; or
//! `SYMPHONY_ETCD_BIN`) started with `--client-cert-auth` on loopback.
//! The certificates are throwaway ones made here (rcgen).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_v3::{Client, Compare, ConnectOptions, RequestOp, Tls, TxnRequest};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

const CALL: Duration = Duration::from_secs(2);
const START: Duration = Duration::from_secs(20);

/// A CA and certificates it signed (PEM).
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA certificate")
}

/// A leaf for `names`, both server and client use (etcd 3.4's gateway
/// dials its own port with the member certificate).
fn leaf(issuer: &CertifiedIssuer<'static, KeyPair>, common_name: &str, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).expect("leaf certificate");
    (cert.pem(), key.serialize_pem())
}

fn pki() -> Pki {
    let issuer = ca("symphony test CA");
    let server = leaf(&issuer, "etcd", &["127.0.0.1", "localhost"]);
    let client = leaf(&issuer, "scheduler", &[]);
    Pki { ca: issuer.pem(), server, client }
}

fn etcd_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("SYMPHONY_ETCD_BIN") {
        return bin.into();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::iter::once(PathBuf::from("/usr/bin")))
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no etcd binary on PATH nor in /usr/bin: install Debian's etcd-server (bash scripts/setup.sh) or set SYMPHONY_ETCD_BIN"))
}

/// An ephemeral loopback port (another process could take it before etcd
/// binds it: etcd then exits and the wait reports its log).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
}

/// One etcd member serving clients over TLS with `--client-cert-auth`;
/// killed and its directory removed on drop.
struct TlsEtcd {
    dir: PathBuf,
    child: Child,
    endpoint: String,
    pki: Pki,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pem).expect("write PEM");
    p
}

impl TlsEtcd {
    fn start(tag: &str) -> TlsEtcd {
        let dir = std::env::temp_dir().join(format!("etcd-v3-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let pki = pki();
        let ca = write(&dir, "ca.pem", &pki.ca);
        let cert = write(&dir, "server.pem", &pki.server.0);
        let key = write(&dir, "server-key.pem", &pki.server.1);
        let (client_port, peer_port) = (free_port(), free_port());
        let client = format!("https://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("log file");
        let child = Command::new(etcd_binary())
            .args(["--name", "m0", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("m0={peer}"), "--initial-cluster-state", "new"])
            .arg("--cert-file")
            .arg(&cert)
            .arg("--key-file")
            .arg(&key)
            .arg("--trusted-ca-file")
            .arg(&ca)
            .arg("--client-cert-auth")
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .env_remove("ETCD_ENDPOINTS")
            .env_remove("ETCDCTL_ENDPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let mut etcd = TlsEtcd { dir, child, endpoint: client, pki };
        etcd.wait_ready();
        etcd
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        log.lines().rev().take(8).collect::<Vec<_>>().join("\n")
    }

    fn mutual_tls(&self) -> Tls {
        Tls::new(self.pki.ca.clone().into_bytes()).with_identity(self.pki.client.0.clone().into_bytes(), self.pki.client.1.clone().into_bytes())
    }

    /// Polls with the authorised client until etcd answers (bounded).
    fn wait_ready(&mut self) {
        let rt = runtime();
        let tls = self.mutual_tls();
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("etcd exited ({status}):\n{}", self.log_tail());
            }
            let answer = rt.block_on(async { Client::connect(std::slice::from_ref(&self.endpoint), &options(Some(tls.clone())))?.get("/ready").await });
            match answer {
                Ok(_) => return,
                Err(e) if start.elapsed() >= START => panic!("etcd did not answer over TLS within {START:?}: {e}\n{}", self.log_tail()),
                Err(_) => std::thread::sleep(pause),
            }
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn options(tls: Option<Tls>) -> ConnectOptions {
    ConnectOptions { timeout: CALL, tls }
}

#[test]
fn a_client_certificate_signed_by_the_ca_runs_the_election_calls_over_tls() {
    let etcd = TlsEtcd::start("mtls");
    let rt = runtime();
    rt.block_on(async {
        // Schemeless endpoints take https when TLS is set.
        let endpoint = etcd.endpoint.trim_start_matches("https://").to_string();
        let mut c = Client::connect(&[endpoint], &options(Some(etcd.mutual_tls()))).expect("client");
        let lease = c.lease_grant(5).await.expect("lease grant");
        assert!(lease.id != 0 && lease.ttl >= 5, "lease {lease:?}");
        let campaign = || TxnRequest::when(vec![Compare::create_revision_is("/t/leader", 0)], vec![RequestOp::put("/t/leader", "a", lease.id)]);
        let won = c.txn(campaign()).await.expect("txn");
        assert!(won.succeeded, "the key was free");
        let revision = won.header.expect("header").revision;
        let got = c.get("/t/leader").await.expect("get");
        let kv = got.kvs.first().expect("the key is stored");
        assert_eq!((kv.value.as_slice(), kv.create_revision, kv.lease), (&b"a"[..], revision, lease.id));
        assert!(!c.txn(campaign()).await.expect("txn").succeeded, "a second campaign loses");
        // A compare on the mod revision: the stale one fails, the current one holds.
        let stale = TxnRequest::when(vec![Compare::mod_revision_is("/t/leader", revision - 1)], vec![RequestOp::put("/t/leader", "b", 0)]);
        assert!(!c.txn(stale).await.expect("txn").succeeded);
        let (mut keeper, mut answers) = c.lease_keep_alive(lease.id).await.expect("keep-alive stream");
        keeper.keep_alive().await.expect("renew");
        let renewed = answers.message().await.expect("answer").expect("one answer per renewal");
        assert_eq!((renewed.id, renewed.ttl > 0), (lease.id, true));
        c.lease_revoke(lease.id).await.expect("revoke");
        assert!(c.get("/t/leader").await.expect("get").kvs.is_empty(), "revoking the lease deletes its key");
        keeper.keep_alive().await.expect("renew after revoke");
        let gone = answers.message().await.expect("answer").expect("an answer");
        assert_eq!(gone.ttl, 0, "a revoked lease answers TTL 0");
        let again = c.lease_revoke(lease.id).await.expect_err("a second revoke");
        assert!(again.to_string().contains("not found"), "{again}");
    });
}

#[test]
fn clients_without_a_certificate_of_the_ca_or_without_tls_are_refused() {
    let etcd = TlsEtcd::start("refuse");
    let rt = runtime();
    let endpoint = vec![etcd.endpoint.clone()];
    let other_ca = ca("another CA");
    let stranger = leaf(&other_ca, "stranger", &[]);
    let refusals = [
        ("no client certificate", Some(Tls::new(etcd.pki.ca.clone().into_bytes()))),
        (
            "a certificate of another CA",
            Some(Tls::new(etcd.pki.ca.clone().into_bytes()).with_identity(stranger.0.into_bytes(), stranger.1.into_bytes())),
        ),
        // Trusting another CA: etcd's own certificate is refused here.
        ("an untrusted server", Some(Tls::new(other_ca.pem().into_bytes()).with_identity(etcd.pki.client.0.clone().into_bytes(), etcd.pki.client.1.clone().into_bytes()))),
    ];
    for (what, tls) in refusals {
        let answer = rt.block_on(async { Client::connect(&endpoint, &options(tls))?.get("/t/x").await });
        // Refused in the handshake or on the first request (TLS 1.3 sends
        // the server's verdict on the client certificate after the handshake).
        match answer {
            Err(e @ etcd_v3::Error::Status(_)) => eprintln!("{what}: refused: {e}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    // Plain HTTP/2 to the TLS port.
    let plain = vec![etcd.endpoint.replace("https://", "http://")];
    let answer = rt.block_on(async { Client::connect(&plain, &options(None))?.get("/t/x").await });
    assert!(answer.is_err(), "plain text: {answer:?}");
    // The authorised client still gets in: the refusals were about the certificate.
    rt.block_on(async { Client::connect(&endpoint, &options(Some(etcd.mutual_tls())))?.get("/t/x").await }).expect("authorised");
    // A scheme that contradicts the setting is refused before any connection.
    let mixed = Client::connect(&plain, &options(Some(etcd.mutual_tls()))).expect_err("http with TLS set");
    assert!(mixed.to_string().contains("https"), "{mixed}");
}
