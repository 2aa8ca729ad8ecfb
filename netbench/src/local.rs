//! `netbench local`: starts P servers on this machine as child processes of
//! this binary (`netbench serve`), optionally each in its own network
//! namespace behind a software switch, with `tc netem` impairments.
//!
//! Namespace topology (all created here, all removed on exit):
//!
//! ```text
//!   nb<pid>s0 [eth0 10.201.0.1] --veth-- s0 \
//!   nb<pid>s1 [eth0 10.201.0.2] --veth-- s1  > br0 in nb<pid>sw
//!   ...                                      /
//!   nb<pid>c  [eth0 10.201.0.254] --veth-- c
//! ```
//!
//! The reader joins `nb<pid>c` (setns on its own thread) before it
//! connects, so every packet stays inside these namespaces. A queueing
//! discipline on each server's egress (`--netem ARGS` = `--server-qdisc
//! "netem ARGS"`: the data direction) and/or on the switch port towards the
//! reader (`--client-qdisc`, e.g. "tbf rate 1gbit burst 64kb latency 1ms":
//! where an incast converges and a shallow buffer drops) shapes the fabric.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration as StdDuration, Instant};

use crate::fail::{Fail, Res};
use crate::server::Idle;
use crate::transport::TransportKind;

/// Subnet of the namespaces (private, only ever inside namespaces made here).
const SUBNET: &str = "10.201.0";
/// Reader's address inside its namespace.
const CLIENT_HOST: u8 = 254;
/// How long a server may take to report its address.
const READY_TIMEOUT: StdDuration = StdDuration::from_secs(20);

/// Options of the local servers.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Transport.
    pub kind: TransportKind,
    /// Number of servers.
    pub servers: usize,
    /// Objects per server.
    pub objects: u32,
    /// Bytes per object.
    pub size: u32,
    /// Server idle behaviour.
    pub idle: Idle,
    /// The RDMA device, port and GID every server opens.
    pub rdma: node_shell::RdmaArgs,
    /// Host the servers listen on without namespaces.
    pub listen_host: String,
    /// One namespace per server.
    pub netns: bool,
    /// `tc` qdisc (kind and arguments) on each server's egress (needs `netns`).
    pub server_qdisc: Option<String>,
    /// `tc` qdisc on the switch port towards the reader (needs `netns`).
    pub client_qdisc: Option<String>,
    /// rdma: servers register their objects remote-writable (`--writable`).
    pub writable: bool,
    /// Largest region, bytes (passed to servers).
    pub max_region: u64,
    /// rdma: receive slots each server pre-posts per connection
    /// (`SYMPHONY_RDMA_RECV_SLOTS` in its environment) [default: the transport's].
    pub recv_slots: Option<u32>,
}

/// Running local servers; stopping them (and removing namespaces) on drop.
pub struct LocalServers {
    children: Vec<Child>,
    /// Addresses the reader connects to.
    pub addrs: Vec<String>,
    netns: Option<Netns>,
}

impl LocalServers {
    /// Starts the servers and waits until each reports its address.
    pub fn start(o: &LocalOptions) -> Res<Self> {
        if o.servers == 0 {
            return Err(Fail::usage("--servers must be at least 1"));
        }
        if o.servers > 200 {
            return Err(Fail::usage(format!(
                "--servers {}: at most 200 local servers",
                o.servers
            )));
        }
        if (o.server_qdisc.is_some() || o.client_qdisc.is_some()) && !o.netns {
            return Err(Fail::usage(
                "--netem, --client-netem and the qdisc options need --netns",
            ));
        }
        if o.netns && !matches!(o.kind, TransportKind::Tcp | TransportKind::TcpBlocking) {
            return Err(Fail::usage(format!(
                "--netns works with tcp and tcp-blocking, not {} (shm needs no network; rdma's \
                 device is bound to the host NIC)",
                o.kind.name()
            )));
        }
        let exe = std::env::current_exe()?;
        let mut me = LocalServers {
            children: Vec::new(),
            addrs: Vec::new(),
            netns: None,
        };
        if o.netns {
            me.netns = Some(Netns::create(
                o.servers,
                o.server_qdisc.as_deref(),
                o.client_qdisc.as_deref(),
            )?);
        }
        for i in 0..o.servers {
            let listen = match &me.netns {
                Some(_) => format!("{SUBNET}.{}:0", i + 1),
                None => o.kind.default_listen(&o.listen_host),
            };
            let mut cmd = match &me.netns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", &ns.server(i)]).arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            cmd.args(["serve", "--transport", o.kind.name(), "--listen", &listen])
                .args([
                    "--objects",
                    &o.objects.to_string(),
                    "--size",
                    &o.size.to_string(),
                ])
                .args([
                    "--id",
                    &i.to_string(),
                    "--max-region",
                    &o.max_region.to_string(),
                ])
                .args([
                    "--server-idle",
                    if o.idle == Idle::Spin {
                        "spin"
                    } else {
                        "block"
                    },
                ])
                .args(rdma_flags(&o.rdma))
                .args(o.writable.then_some("--writable"))
                .arg("--exit-with-parent")
                .envs(
                    o.recv_slots
                        .filter(|_| o.kind == TransportKind::Rdma)
                        // dataplane::transport::rdma::ENV_RECV_SLOTS (a module
                        // that exists only where verbs are built in).
                        .map(|n| ("SYMPHONY_RDMA_RECV_SLOTS", n.to_string())),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = cmd
                .spawn()
                .map_err(Fail::caused(format!("cannot start server {i}")))?;
            let stdout = child.stdout.take();
            me.children.push(child);
            let addr = wait_ready(stdout, me.children.last_mut().expect("just pushed"), i)?;
            me.addrs.push(addr);
        }
        Ok(me)
    }

    /// Moves the calling thread into the reader's namespace (no-op without
    /// namespaces). Call before connecting, on the thread that connects.
    pub fn enter_client_netns(&self) -> Res<()> {
        match &self.netns {
            Some(ns) => ns.enter_client(),
            None => Ok(()),
        }
    }

    /// Describes the fabric for reports.
    pub fn fabric(&self, o: &LocalOptions) -> String {
        match &self.netns {
            None if o.kind == TransportKind::Shm => "shared memory on this host".to_string(),
            None => format!("loopback ({}), {} local servers", o.listen_host, o.servers),
            Some(_) => {
                let mut s = format!("{} network namespaces + veth + bridge", o.servers);
                if let Some(n) = &o.server_qdisc {
                    s.push_str(&format!(", server egress qdisc '{n}'"));
                }
                if let Some(n) = &o.client_qdisc {
                    s.push_str(&format!(", reader port qdisc '{n}'"));
                }
                s
            }
        }
    }
}

impl Drop for LocalServers {
    fn drop(&mut self) {
        for c in &mut self.children {
            // SAFETY: plain kill(2) of a child process this struct started
            // and has not reaped yet (its pid cannot have been reused).
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + StdDuration::from_secs(3);
        for c in &mut self.children {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(StdDuration::from_millis(5))
                    }
                    Ok(None) => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
        if let Some(ns) = self.netns.take() {
            ns.remove();
        }
    }
}

/// Reads a server's first stdout line ("listening ADDR"), bounded in time.
fn wait_ready(
    stdout: Option<std::process::ChildStdout>,
    child: &mut Child,
    i: usize,
) -> Res<String> {
    let Some(out) = stdout else {
        return Err(Fail::runtime("server stdout not captured"));
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        if let Some(Ok(first)) = lines.next() {
            let _ = tx.send(first);
        }
        // Keep draining so the server never blocks on a full pipe.
        for _ in lines {}
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(line) => match line.strip_prefix("listening ") {
            Some(addr) => Ok(addr.trim().to_string()),
            None => Err(Fail::runtime(format!(
                "server {i} said {line:?} instead of its address"
            ))),
        },
        Err(_) => {
            let status = child.try_wait().ok().flatten();
            Err(Fail::runtime(match status {
                Some(s) => {
                    format!("server {i} exited ({s}) before it was ready (see its message above)")
                }
                None => format!(
                    "server {i} did not report its address within {} s",
                    READY_TIMEOUT.as_secs()
                ),
            }))
        }
    }
}

/// Namespaces made by this process.
struct Netns {
    prefix: String,
    servers: usize,
    created: Vec<String>,
}

fn ip(args: &[&str]) -> Res<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(Fail::caused("cannot run `ip` (iproute2)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Fail::runtime(format!(
            "`ip {}` failed: {} (needs root and iproute2)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn tc(ns: &str, dev: &str, qdisc: &str) -> Res<()> {
    let mut args = vec!["-n", ns, "qdisc", "replace", "dev", dev, "root"];
    args.extend(qdisc.split_whitespace());
    let out = Command::new("tc")
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .map_err(Fail::caused("cannot run `tc` (iproute2)"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let hint = if err.contains("qdisc kind is unknown") {
            " (this kernel lacks that qdisc: netem needs CONFIG_NET_SCH_NETEM / module sch_netem; \
             `tbf` or `htb` may be there)"
        } else {
            ""
        };
        Err(Fail::usage(format!(
            "`tc {}` failed: {err}{hint}",
            args.join(" ")
        )))
    }
}

impl Netns {
    fn create(
        servers: usize,
        server_qdisc: Option<&str>,
        client_qdisc: Option<&str>,
    ) -> Res<Netns> {
        remove_stale();
        let prefix = format!("nb{}", std::process::id());
        let mut me = Netns {
            prefix,
            servers,
            created: Vec::new(),
        };
        if let Err(e) = me.build(server_qdisc, client_qdisc) {
            me.remove();
            return Err(e);
        }
        Ok(me)
    }

    fn server(&self, i: usize) -> String {
        format!("{}s{i}", self.prefix)
    }
    fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }
    fn client(&self) -> String {
        format!("{}c", self.prefix)
    }

    fn add_ns(&mut self, name: &str) -> Res<()> {
        ip(&["netns", "add", name])?;
        self.created.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    fn build(&mut self, server_qdisc: Option<&str>, client_qdisc: Option<&str>) -> Res<()> {
        let sw = self.switch();
        self.add_ns(&sw)?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        let mut ends: Vec<(String, String, u8)> = (0..self.servers)
            .map(|i| (self.server(i), format!("s{i}"), (i + 1) as u8))
            .collect();
        ends.push((self.client(), "c".to_string(), CLIENT_HOST));
        for (ns, port, host) in &ends {
            self.add_ns(ns)?;
            ip(&[
                "-n", &sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ])?;
            ip(&["-n", &sw, "link", "set", port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", port, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{SUBNET}.{host}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        if let Some(n) = server_qdisc {
            for i in 0..self.servers {
                tc(&self.server(i), "eth0", n)?;
            }
        }
        if let Some(n) = client_qdisc {
            tc(&sw, "c", n)?;
        }
        Ok(())
    }

    /// setns(2) of the calling thread into the reader's namespace.
    fn enter_client(&self) -> Res<()> {
        let path = format!("/run/netns/{}", self.client());
        let f = std::fs::File::open(&path)
            .map_err(Fail::caused(format!("cannot open {path}")))?;
        // SAFETY: setns(2) on a valid namespace fd we hold open; it affects
        // only the calling thread's network namespace.
        let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        if r != 0 {
            return Err(Fail::runtime(format!(
                "cannot enter namespace {}: {}",
                self.client(),
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }

    fn remove(&self) {
        for ns in self.created.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Removes namespaces left by netbench processes that no longer exist
/// (killed before they could clean up). Only names of the form `nb<pid>...`
/// whose pid is gone are touched.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix("nb") else {
            continue;
        };
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let tail = &rest[digits.len()..];
        let ours = !digits.is_empty()
            && (tail == "c"
                || tail == "sw"
                || (tail.starts_with('s')
                    && tail[1..].chars().all(|c| c.is_ascii_digit())
                    && tail.len() > 1));
        if !ours {
            continue;
        }
        if std::path::Path::new(&format!("/proc/{digits}")).exists() {
            continue;
        }
        let _ = ip(&["netns", "del", name]);
    }
}

/// The RDMA selection given to `netbench local` as flags for its servers.
fn rdma_flags(r: &node_shell::RdmaArgs) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(d) = &r.rdma_device {
        v.extend(["--rdma-device".to_string(), d.clone()]);
    }
    if let Some(p) = r.rdma_port {
        v.extend(["--rdma-port".to_string(), p.to_string()]);
    }
    if let Some(g) = r.gid_index {
        v.extend(["--gid-index".to_string(), g.to_string()]);
    }
    v
}
