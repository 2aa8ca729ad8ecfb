//! [`LocalEtcd`]: a throwaway etcd cluster of 1 or 3 members on loopback,
//! as child processes (Debian's `etcd-server`, installed by
//! `scripts/setup.sh`): what the election tests and `symphony up --ha`
//! run against. Ports are ephemeral (asked of the kernel), the data lives
//! in a fresh temporary directory removed on drop, and the members are
//! killed on drop.
//!
//! The members use a 50 ms raft heartbeat and a 500 ms election timeout:
//! etcd raises every lease's TTL to at least 1.5 election timeouts, so a
//! 1 s lease stays 1 s (with etcd's defaults it would be 2 s).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Why a local etcd could not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalEtcdError {
    /// No `etcd` binary.
    #[error("no etcd binary ({0}); install Debian's etcd-server (bash scripts/setup.sh) or set SYMPHONY_ETCD_BIN")]
    Missing(String),
    /// Spawning or preparing failed.
    #[error("cannot start etcd: {0}")]
    Io(#[from] std::io::Error),
    /// It did not become healthy in time.
    #[error("etcd did not answer on {0} within {1:?}")]
    NotHealthy(String, std::time::Duration),
}

/// One member.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A local etcd cluster (see the module docs).
#[derive(Debug)]
pub struct LocalEtcd {
    dir: PathBuf,
    bin: String,
    members: Vec<Member>,
}

/// The etcd binary: `SYMPHONY_ETCD_BIN`, else `etcd` on the PATH or in
/// `/usr/bin` (Debian puts it there).
pub fn etcd_binary() -> Option<String> {
    if let Ok(b) = std::env::var("SYMPHONY_ETCD_BIN") {
        return Some(b);
    }
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::iter::once(PathBuf::from("/usr/bin")))
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
}

fn free_port() -> std::io::Result<u16> {
    // Another process could take it before the member binds it; the
    // member then fails to start and `start` reports it.
    dataplane::control::unused_port()
}

impl LocalEtcd {
    /// Starts `members` (1 or more; 3 for a quorum that survives one
    /// loss) and waits until each answers, at most `timeout`.
    pub fn start(members: usize, timeout: std::time::Duration) -> Result<LocalEtcd, LocalEtcdError> {
        let bin = etcd_binary().ok_or_else(|| LocalEtcdError::Missing("not on PATH nor in /usr/bin".into()))?;
        let dir = std::env::temp_dir().join(format!("symphony-etcd-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir)?;
        let mut ms = Vec::new();
        for k in 0..members.max(1) {
            ms.push(Member { name: format!("m{k}"), client_port: free_port()?, peer_port: free_port()?, child: None });
        }
        let mut etcd = LocalEtcd { dir, bin, members: ms };
        for k in 0..etcd.members.len() {
            etcd.spawn(k)?;
        }
        etcd.wait_healthy(timeout)?;
        Ok(etcd)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, k: usize) -> Result<(), LocalEtcdError> {
        let cluster = self.initial_cluster();
        let m = &self.members[k];
        let data = self.dir.join(&m.name);
        let log = std::fs::File::create(self.dir.join(format!("{}.log", m.name)))?;
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&self.bin)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster, "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "symphony-local"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .env_remove("ETCD_ENDPOINTS")
            .env_remove("ETCDCTL_ENDPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.members[k].child = Some(child);
        Ok(())
    }

    /// Waits until every running member serves `/health` with a leader.
    fn wait_healthy(&mut self, timeout: std::time::Duration) -> Result<(), LocalEtcdError> {
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(10);
        loop {
            let pending: Vec<u16> = self
                .members
                .iter()
                .filter(|m| m.child.is_some())
                .map(|m| m.client_port)
                .filter(|p| !health_ok(*p))
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            for m in &mut self.members {
                if let Some(c) = m.child.as_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        let log = std::fs::read_to_string(self.dir.join(format!("{}.log", m.name))).unwrap_or_default();
                        let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                        return Err(LocalEtcdError::Io(std::io::Error::other(format!(
                            "member {} exited ({status}): {tail}",
                            m.name
                        ))));
                    }
                }
            }
            if start.elapsed() >= timeout {
                return Err(LocalEtcdError::NotHealthy(format!("127.0.0.1:{pending:?}"), timeout));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
    }

    /// The client endpoints of every member (`http://127.0.0.1:PORT`).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| format!("http://127.0.0.1:{}", m.client_port)).collect()
    }

    /// SIGKILLs member `k` (0-based); its data stays for a restart.
    pub fn kill_member(&mut self, k: usize) {
        if let Some(mut c) = self.members.get_mut(k).and_then(|m| m.child.take()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILLs every member.
    pub fn kill_all(&mut self) {
        for k in 0..self.members.len() {
            self.kill_member(k);
        }
    }

    /// Restarts member `k` on its data and waits until it answers.
    pub fn restart_member(&mut self, k: usize, timeout: std::time::Duration) -> Result<(), LocalEtcdError> {
        if self.members.get(k).is_some_and(|m| m.child.is_none()) {
            // Its data directory exists now: `new` is ignored for a
            // member that already has data.
            self.spawn(k)?;
        }
        self.wait_healthy(timeout)
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// etcd's `/health` over plain HTTP/1.0 on loopback: `"health":"true"`
/// once the member has a raft leader.
fn health_ok(port: u16) -> bool {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_millis(500)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
