//! An etcd v3 gRPC client for exactly the calls Symphony makes: read one
//! key (`Range`), a transaction of compares and puts (`Txn`), and leases
//! (`LeaseGrant`, `LeaseRevoke`, `LeaseKeepAlive`). What the scheduler's
//! leader election and routing table need, nothing else.
//!
//! The gRPC code is generated at build time from `proto/etcd_v3.proto` (a
//! trimmed copy of etcd's API, same field numbers) by protox, a protobuf
//! compiler written in Rust: building needs no system `protoc`.
//!
//! Transport: plain HTTP/2, or TLS (rustls with ring, through tonic's
//! `tls-ring`) given a CA certificate, optionally with a client certificate
//! and key for etcd's `--client-cert-auth`. Several endpoints are balanced
//! over one channel; a channel connects lazily, so a store that is down at
//! connect time shows up as failing calls, each bounded by the timeout.
#![warn(missing_docs)]

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The generated messages and clients (etcd's package `etcdserverpb`).
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::request_op::Request;
pub use pb::{
    Compare, KeyValue, LeaseGrantResponse, LeaseKeepAliveResponse, LeaseRevokeResponse, RangeResponse, RequestOp, ResponseHeader,
    TxnRequest, TxnResponse,
};

/// The largest PEM file [`Tls::from_files`] reads: certificates and keys
/// are a few KiB; anything this large is not one.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint to connect to.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// An endpoint that is not a URL, or a scheme that contradicts the
    /// TLS setting.
    #[error("etcd endpoint {endpoint:?}: {why}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        why: String,
    },
    /// Setting up the channel failed (bad TLS material, among others).
    #[error("etcd transport: {}", chain(.0))]
    Transport(#[from] tonic::transport::Error),
    /// etcd (or the transport under a call) answered with an error status.
    #[error("etcd: {0}")]
    Status(#[from] tonic::Status),
    /// The keep-alive stream could not be opened or written.
    #[error("lease keep-alive: {0}")]
    KeepAlive(String),
}

/// `e` and its sources, `: `-separated (tonic's transport error alone says
/// only "transport error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    // Bounded: error chains are short, but a cycle must not hang.
    for _ in 0..8 {
        let Some(s) = source else { break };
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// TLS towards etcd: the CA that signed the members' certificates and,
/// for etcd's `--client-cert-auth`, this client's certificate and key.
#[derive(Clone)]
pub struct Tls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls").field("client_certificate", &self.identity.is_some()).finish_non_exhaustive()
    }
}

impl Tls {
    /// Server authentication only: trust members whose certificates `ca_pem`
    /// (PEM) signed.
    pub fn new(ca_pem: Vec<u8>) -> Tls {
        Tls { ca_pem, identity: None }
    }

    /// Also present this client certificate chain and its private key (both
    /// PEM) when etcd asks for one.
    pub fn with_identity(mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Tls {
        self.identity = Some((cert_pem, key_pem));
        self
    }

    /// Reads the CA certificate and, if given, the client certificate and
    /// key from PEM files (each at most [`MAX_PEM_BYTES`]).
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> std::io::Result<Tls> {
        let tls = Tls::new(read_pem(ca)?);
        Ok(match identity {
            Some((cert, key)) => tls.with_identity(read_pem(cert)?, read_pem(key)?),
            None => tls,
        })
    }

    fn client_config(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

/// A PEM file, refused beyond [`MAX_PEM_BYTES`] (a wrong path can name
/// anything).
fn read_pem(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: larger than {MAX_PEM_BYTES} bytes, not a PEM certificate or key", path.display()),
        ));
    }
    Ok(bytes)
}

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// Bound on connecting and on each call's answer (for the keep-alive
    /// stream: on its opening).
    pub timeout: Duration,
    /// `None`: plain HTTP/2.
    pub tls: Option<Tls>,
}

/// A connection to an etcd cluster; cheap to clone (clones share the
/// channel).
#[derive(Clone, Debug)]
pub struct Client {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
}

/// The channel endpoint for `url`: `host:port` takes `https://` with TLS
/// and `http://` without; an explicit scheme must agree with the setting.
fn endpoint(url: &str, options: &ConnectOptions) -> Result<Endpoint, Error> {
    let bad = |why: &str| Error::Endpoint { endpoint: url.to_string(), why: why.to_string() };
    let uri = match (url.split_once("://").map(|(scheme, _)| scheme), &options.tls) {
        (Some("http"), None) | (Some("https"), Some(_)) => url.to_string(),
        (Some("http"), Some(_)) => return Err(bad("TLS is configured: give https:// or no scheme")),
        (Some("https"), None) => return Err(bad("https needs a CA certificate (TLS settings)")),
        (Some(_), _) => return Err(bad("the scheme must be http or https")),
        (None, Some(_)) => format!("https://{url}"),
        (None, None) => format!("http://{url}"),
    };
    let mut ep = Endpoint::from_shared(uri).map_err(|e| bad(&e.to_string()))?.connect_timeout(options.timeout).timeout(options.timeout);
    if let Some(tls) = &options.tls {
        ep = ep.tls_config(tls.client_config())?;
    }
    Ok(ep)
}

impl Client {
    /// A client over `endpoints` (`host:port`, `http://host:port` or
    /// `https://host:port`), balanced. Connects lazily: this fails only on
    /// bad endpoints or TLS settings, never on an unreachable store. Must
    /// run inside a tokio runtime (the balancer is a task of it).
    pub fn connect(endpoints: &[String], options: &ConnectOptions) -> Result<Client, Error> {
        if endpoints.is_empty() {
            return Err(Error::NoEndpoint);
        }
        let list = endpoints.iter().map(|e| endpoint(e, options)).collect::<Result<Vec<_>, _>>()?;
        let channel = Channel::balance_list(list.into_iter());
        Ok(Client { kv: KvClient::new(channel.clone()), lease: LeaseClient::new(channel) })
    }

    /// The key `key` (none or one key-value).
    pub async fn get(&mut self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, Error> {
        let req = pb::RangeRequest { key: key.into(), ..Default::default() };
        Ok(self.kv.range(req).await?.into_inner())
    }

    /// A transaction: `success` if every compare holds, else `failure`.
    pub async fn txn(&mut self, txn: TxnRequest) -> Result<TxnResponse, Error> {
        Ok(self.kv.txn(txn).await?.into_inner())
    }

    /// A new lease of `ttl_secs` seconds (etcd may raise it) with an id
    /// etcd picks.
    pub async fn lease_grant(&mut self, ttl_secs: i64) -> Result<LeaseGrantResponse, Error> {
        let req = pb::LeaseGrantRequest { ttl: ttl_secs, id: 0 };
        Ok(self.lease.lease_grant(req).await?.into_inner())
    }

    /// Revokes lease `id`, deleting every key attached to it.
    pub async fn lease_revoke(&mut self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        Ok(self.lease.lease_revoke(pb::LeaseRevokeRequest { id }).await?.into_inner())
    }

    /// Opens a keep-alive stream for lease `id` and renews it once: a
    /// lease that is already gone (TTL 0 in the first answer) is an error.
    /// Each later [`LeaseKeeper::keep_alive`] is answered by one message on
    /// the returned stream.
    pub async fn lease_keep_alive(&mut self, id: i64) -> Result<(LeaseKeeper, KeepAliveStream), Error> {
        // Requests go one at a time (send, then read its answer): a small
        // bound suffices.
        let (tx, rx) = mpsc::channel(4);
        let keeper = LeaseKeeper { id, requests: tx };
        keeper.send().await?;
        let mut stream = self.lease.lease_keep_alive(ReceiverStream::new(rx)).await?.into_inner();
        match stream.message().await? {
            Some(first) if first.ttl > 0 => Ok((keeper, stream)),
            Some(_) => Err(Error::KeepAlive(format!("lease {id} not found"))),
            None => Err(Error::KeepAlive("the stream ended before its first answer".into())),
        }
    }
}

/// The answers of a keep-alive stream.
pub type KeepAliveStream = tonic::Streaming<LeaseKeepAliveResponse>;

/// The sending half of a lease's keep-alive stream.
#[derive(Debug)]
pub struct LeaseKeeper {
    id: i64,
    requests: mpsc::Sender<pb::LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// The lease renewed.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Asks for one renewal; the answer arrives on the stream.
    pub async fn keep_alive(&mut self) -> Result<(), Error> {
        self.send().await
    }

    async fn send(&self) -> Result<(), Error> {
        self.requests.send(pb::LeaseKeepAliveRequest { id: self.id }).await.map_err(|_| Error::KeepAlive("the stream is closed".into()))
    }
}

impl Compare {
    /// "`key`'s create revision is `revision`" (0: the key does not exist).
    pub fn create_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare {
            result: CompareResult::Equal.into(),
            target: CompareTarget::Create.into(),
            key: key.into(),
            target_union: Some(TargetUnion::CreateRevision(revision)),
        }
    }

    /// "`key` was last modified at `revision`".
    pub fn mod_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare {
            result: CompareResult::Equal.into(),
            target: CompareTarget::Mod.into(),
            key: key.into(),
            target_union: Some(TargetUnion::ModRevision(revision)),
        }
    }
}

impl RequestOp {
    /// Puts `value` under `key`, attached to `lease` (0: none).
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> RequestOp {
        RequestOp { request: Some(Request::RequestPut(pb::PutRequest { key: key.into(), value: value.into(), lease, ..Default::default() })) }
    }
}

impl TxnRequest {
    /// If every one of `compare` holds, do `success` (else nothing).
    pub fn when(compare: Vec<Compare>, success: Vec<RequestOp>) -> TxnRequest {
        TxnRequest { compare, success, failure: Vec::new() }
    }
}
