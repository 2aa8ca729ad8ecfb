//! netbench: the incast one-sided READ tail-latency benchmark, and the
//! calibration of the scheduler's network delay bound.
//!
//! ```text
//! netbench serve     --transport T --listen ADDR --objects K --size S
//! netbench incast    --transport T --peers A,B,... --objects K --size S --iters N [--json|--csv]
//! netbench local     --transport T --servers P [--netns [--netem ..]] --objects K --size S --iters N
//! netbench calibrate --transport T (--peers ..|--servers P) --percentile 99.99 --out delay.toml
//! netbench plot      run1.json run2.json --out fig.svg
//! netbench lat|bw    --transport T --verb read|write|send [-a|-s S] [-n N|-D SECS] [-q QPS]
//!                    [--tx-depth D] [--bidirectional] [--under-load] [--servers P|--peers ..]
//!                    [-d DEV -i PORT -x GID] [--json|--csv] [--svg sweep.svg]
//! netbench sweep-plot lat.json bw.json ... --out sweep.svg
//! ```
//! See docs/_parts/netbench.md for the method and measured figures.
//! The binary is [`main`]; [`command`] is its command line, which
//! `symphony docs` renders into docs/cli.md.

mod args;
mod calibrate;
mod calibrate_cmd;
mod client;
mod fail;
mod local;
mod pattern;
mod perf;
mod perf_out;
mod perf_proto;
mod plot;
mod output;
mod proto;
mod server;
mod server_raw;
mod stats;
mod transport;


use clap::{CommandFactory, Parser};
use dataplane::time::Duration;
use dataplane::transport::Domain;

use args::{Cli, Cmd, IncastArgs, LocalArgs, LocalOpts, Measure, ServeArgs, Shape};
use client::{BenchConfig, Client, Input, RunResult};
use fail::{Fail, Res};
use output::{emit, report};
use server::Idle;
use transport::{DomainOptions, TransportKind, WithDomain};

/// netbench's command line (every subcommand and flag).
pub fn command() -> clap::Command {
    Cli::command()
}

/// The `netbench` binary.
pub fn main() {
    let cli = Cli::parse();
    node_shell::logging::init_cli();
    // `--rdma-device`/`--rdma-port`/`--gid-index` reach the domain opened
    // deep inside each command through the process's RDMA selection.
    match &cli.cmd {
        Cmd::Serve(a) => a.shape.rdma.select(),
        Cmd::Incast(a) => a.work.shape.rdma.select(),
        Cmd::Local(a) => a.work.shape.rdma.select(),
        Cmd::Calibrate(a) => a.work.shape.rdma.select(),
        Cmd::Plot(_) | Cmd::SweepPlot(_) => {}
        // -d/-i/-x are selected by the command itself.
        Cmd::Lat(_) | Cmd::Bw(_) => {}
    }
    let r = match cli.cmd {
        Cmd::Serve(a) => cmd_serve(a),
        Cmd::Incast(a) => cmd_incast(a),
        Cmd::Local(a) => cmd_local(a),
        Cmd::Calibrate(a) => calibrate_cmd::cmd_calibrate(a),
        Cmd::Plot(a) => output::cmd_plot(a),
        Cmd::Lat(a) => perf_out::cmd_perf(a, perf::Test::Lat),
        Cmd::Bw(a) => perf_out::cmd_perf(a, perf::Test::Bw),
        Cmd::SweepPlot(a) => perf_out::cmd_sweep_plot(a),
    };
    if let Err(f) = r {
        eprintln!("netbench: error: {f}");
        std::process::exit(f.code());
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Longest READ a transport takes, known before opening it.
pub(crate) fn max_read_for(kind: TransportKind) -> u32 {
    match kind {
        TransportKind::Tcp => {
            dataplane::transport::tcp::TcpConfig::new(dataplane::transport::tcp::Engine::Uring)
                .max_read_len
        }
        TransportKind::TcpBlocking => {
            dataplane::transport::tcp::TcpConfig::new(dataplane::transport::tcp::Engine::Blocking)
                .max_read_len
        }
        TransportKind::Shm => dataplane::transport::shm::ShmConfig::default().max_read_len,
        TransportKind::Rdma => 1 << 30,
    }
}

fn cmd_serve(a: ServeArgs) -> Res<()> {
    a.shape.check(a.transport)?;
    if a.transport == TransportKind::Rdma {
        server_raw::ask_raw_depth(server_raw::SERVE_RAW_DEPTH);
    }
    let duration = match a.duration_s {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            return Err(Fail::usage("--duration-s must be positive"))
        }
        Some(s) => Some(std::time::Duration::from_secs_f64(s)),
        None => None,
    };
    let cfg = server::ServeConfig {
        kind: a.transport,
        listen: a
            .listen
            .unwrap_or_else(|| a.transport.default_listen("127.0.0.1")),
        objects: a.shape.objects,
        size: a.shape.size,
        id: a.id,
        idle: a.idle,
        exit_with_parent: a.exit_with_parent,
        duration,
        exit_after_clients: a.exit_after_clients,
        max_region: a.shape.max_region,
        writable: a.writable,
    };
    server::serve(
        cfg,
        DomainOptions {
            read_timeout: ms(10_000),
        },
    )
}

pub(crate) fn bench_config(shape: &Shape, m: &Measure) -> Res<BenchConfig> {
    if m.iters == 0 {
        return Err(Fail::usage("--iters must be at least 1"));
    }
    if m.concurrency == Some(0) {
        return Err(Fail::usage("--concurrency must be at least 1"));
    }
    if m.connect_timeout_ms == 0 || m.round_timeout_ms == 0 {
        return Err(Fail::usage("timeouts must be at least 1 ms"));
    }
    proto::check_ping_size(m.ping_size)?;
    Ok(BenchConfig {
        objects: shape.objects,
        size: shape.size,
        iters: m.iters,
        warmup: m.warmup.unwrap_or((m.iters / 10).clamp(1, 1000)),
        concurrency: m.concurrency,
        ping_size: m.ping_size,
        ping_every: m.ping_every,
        verify_every: m.verify_every,
        connect_timeout: ms(m.connect_timeout_ms),
        round_timeout: ms(m.round_timeout_ms),
        reader_idle: m.reader_idle,
    })
}

/// Connects to `addrs` and runs every plan in turn on the same connections.
pub(crate) struct RunPlans {
    addrs: Vec<String>,
    cfg: BenchConfig,
    plans: Vec<Vec<Input>>,
    max_region: u64,
    kind: TransportKind,
}

impl WithDomain for RunPlans {
    type Out = Vec<RunResult>;
    fn run<D: Domain>(self, domain: D) -> Res<Vec<RunResult>> {
        server::check_shape(
            self.cfg.objects,
            self.cfg.size,
            domain.max_read_len(),
            self.max_region,
            self.kind,
        )?;
        let mut client = Client::connect(domain, &self.addrs, self.cfg)?;
        let mut out = Vec::with_capacity(self.plans.len());
        for plan in &self.plans {
            out.push(client.run(plan, self.max_region)?);
        }
        Ok(out)
    }
}

/// Runs the full incast (every object of every peer per round) against
/// `addrs`; returns the inputs per round and the result.
fn run_full_incast(
    kind: TransportKind,
    addrs: &[String],
    cfg: &BenchConfig,
    max_region: u64,
) -> Res<(usize, RunResult)> {
    let plan = client::full_plan(addrs.len(), cfg.objects);
    let inputs = plan.len();
    let task = RunPlans {
        addrs: addrs.to_vec(),
        cfg: cfg.clone(),
        plans: vec![plan],
        max_region,
        kind,
    };
    let mut res = transport::with_domain(
        kind,
        DomainOptions {
            read_timeout: cfg.round_timeout,
        },
        task,
    )?;
    let first = res
        .drain(..)
        .next()
        .ok_or_else(|| Fail::runtime("the run produced no result"))?;
    Ok((inputs, first))
}

pub(crate) fn check_peers(peers: &[String]) -> Res<()> {
    if peers.is_empty() || peers.iter().any(|p| p.trim().is_empty()) {
        return Err(Fail::usage("--peers needs at least one non-empty address"));
    }
    Ok(())
}

fn cmd_incast(a: IncastArgs) -> Res<()> {
    check_peers(&a.peers)?;
    let cfg = bench_config(&a.work.shape, &a.work.measure)?;
    let (inputs, res) = run_full_incast(a.transport, &a.peers, &cfg, a.work.shape.max_region)?;
    let fabric = a
        .fabric
        .unwrap_or_else(|| format!("{} peer(s) over {}", a.peers.len(), a.transport.name()));
    let rep = report(
        a.transport,
        fabric,
        a.output.label.clone(),
        a.peers,
        &cfg,
        inputs,
        &res,
    )?;
    emit(&rep, &a.output)
}

pub(crate) fn local_options(kind: TransportKind, l: &LocalOpts, shape: &Shape) -> local::LocalOptions {
    local::LocalOptions {
        kind,
        servers: l.servers,
        objects: shape.objects,
        size: shape.size,
        idle: l.server_idle,
        rdma: shape.rdma.clone(),
        listen_host: l.listen_host.clone(),
        netns: l.netns,
        server_qdisc: l
            .server_qdisc
            .clone()
            .or_else(|| l.netem.as_ref().map(|n| format!("netem {n}"))),
        client_qdisc: l
            .client_qdisc
            .clone()
            .or_else(|| l.client_netem.as_ref().map(|n| format!("netem {n}"))),
        max_region: shape.max_region,
        writable: false,
        recv_slots: None,
    }
}

/// Notes on stderr what a single host does to the numbers.
pub(crate) fn note_oversubscription(servers: usize, idle: Idle, kind: TransportKind) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if idle == Idle::Spin && servers + 1 > cores {
        tracing::warn!(
            "{servers} spinning servers + 1 reader on {cores} cores: \
             expect scheduler preemption in the tails (--server-idle block avoids it)"
        );
    }
    if kind == TransportKind::Rdma && idle == Idle::Block {
        tracing::warn!(
            "rdma servers cannot block in the kernel; when idle they back off to \
             sleeps (50 us, then 1 ms), which inflates ctrl_rtt (READs need no server CPU); \
             use --server-idle spin with a spare core per server to measure ctrl_rtt"
        );
    }
}

fn cmd_local(a: LocalArgs) -> Res<()> {
    let cfg = bench_config(&a.work.shape, &a.work.measure)?;
    a.work.shape.check(a.transport)?;
    let lo = local_options(a.transport, &a.local, &a.work.shape);
    note_oversubscription(lo.servers, lo.idle, lo.kind);
    let servers = local::LocalServers::start(&lo)?;
    servers.enter_client_netns()?;
    let (inputs, res) = run_full_incast(a.transport, &servers.addrs, &cfg, a.work.shape.max_region)?;
    let rep = report(
        a.transport,
        servers.fabric(&lo),
        a.output.label.clone(),
        servers.addrs.clone(),
        &cfg,
        inputs,
        &res,
    )?;
    drop(servers);
    emit(&rep, &a.output)
}

