//! netbench: the incast one-sided READ tail-latency benchmark, and the
//! calibration of the scheduler's network delay bound.
//!
//! ```text
//! netbench serve     --transport T --listen ADDR --objects K --size S
//! netbench incast    --transport T --peers A,B,... --objects K --size S --iters N [--json|--csv]
//! netbench local     --transport T --servers P [--netns [--netem ..]] --objects K --size S --iters N
//! netbench calibrate --transport T (--peers ..|--servers P) --percentile 99.99 --out delay.toml
//! netbench plot      run1.json run2.json --out fig.svg
//! ```
//! See docs/_parts/netbench.md for the method and measured figures.

mod calibrate;
mod client;
mod fail;
mod local;
mod pattern;
mod plot;
mod proto;
mod server;
mod stats;
mod transport;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use dataplane::time::Duration;
use dataplane::transport::Domain;

use client::{BenchConfig, Client, Input, ReaderIdle, RunResult};
use fail::{Fail, Res};
use server::Idle;
use stats::Report;
use transport::{DomainOptions, TransportKind, WithDomain};

#[derive(Parser)]
#[command(
    name = "netbench",
    version,
    about = "Incast one-sided READ tail-latency benchmark (rdma, tcp, tcp-blocking, shm) and \
             calibration of the scheduler's network delay bound"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve K objects of S bytes for READs; answer catalog requests and pings.
    Serve(ServeArgs),
    /// Measure incast rounds against running servers.
    Incast(IncastArgs),
    /// Start P servers on this machine, then measure incast rounds against them.
    Local(LocalArgs),
    /// Measure d_ctrl and d_data and write the scheduler's delay file.
    Calibrate(CalibrateArgs),
    /// Draw percentile plots of saved runs (JSON from --json/--save) as SVG.
    Plot(PlotArgs),
}

/// Bytes: a number with an optional suffix (K/KiB = 1024, M/MiB = 1024^2,
/// KB = 1000, MB = 1000^2).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 153600, 150KiB, 1MiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_object_size(s: &str) -> Result<u32, String> {
    let v = parse_size(s)?;
    u32::try_from(v).map_err(|_| format!("{s:?}: object sizes go up to 4 GiB - 1"))
}

#[derive(Args, Clone)]
struct Shape {
    /// Objects per server.
    #[arg(long, short = 'k', default_value_t = 8)]
    objects: u32,
    /// Bytes per object (suffixes: KiB, MiB, KB, MB).
    #[arg(long, short = 's', default_value = "150KiB", value_parser = parse_object_size)]
    size: u32,
    /// Largest registered region (server objects, reader landing buffers).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    max_region: u64,
}

#[derive(Args, Clone)]
struct Measure {
    /// Measured rounds.
    #[arg(long, short = 'n', default_value_t = 1000)]
    iters: u64,
    /// Unmeasured rounds first [default: iters/10, 1..=1000].
    #[arg(long)]
    warmup: Option<u64>,
    /// READs outstanding per peer [default: all of a round's at once].
    #[arg(long)]
    concurrency: Option<usize>,
    /// Control message size in bytes on the wire: 32 (Heartbeat) or 56..=32768.
    #[arg(long, default_value_t = 32)]
    ping_size: usize,
    /// Time a control message round trip after every this many rounds (0 = never: servers
    /// that sleep when idle then never wake during a READ-latency run).
    #[arg(long, default_value_t = 1)]
    ping_every: u64,
    /// Check one READ's landed bytes every this many rounds (0 = never).
    #[arg(long, default_value_t = 1)]
    verify_every: u64,
    /// Bound on connecting to a peer and getting its catalog, ms.
    #[arg(long, default_value_t = 5000)]
    connect_timeout_ms: u64,
    /// Bound on one round (and one ping), ms.
    #[arg(long, default_value_t = 10000)]
    round_timeout_ms: u64,
    /// How the reader waits for answers: spin (busy-poll) or block (sleep in the kernel on
    /// the connection, as sockperf's and qperf's clients do; one peer only for READs).
    #[arg(long, value_enum, default_value_t = ReaderIdle::Spin)]
    reader_idle: ReaderIdle,
}

#[derive(Args, Clone)]
struct Output {
    /// Print the report as JSON (with HdrHistogram V2 base64 histograms).
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV instead of the table.
    #[arg(long)]
    csv: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Also draw this run's percentile plot (SVG).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Name of the run in reports and plots.
    #[arg(long)]
    label: Option<String>,
}

#[derive(Args, Clone)]
struct LocalOpts {
    /// Servers to start on this machine.
    #[arg(long, short = 'p', default_value_t = 8)]
    servers: usize,
    /// Put each server (and the reader) in its own network namespace, joined by veth pairs
    /// and a bridge (tcp transports; needs root and iproute2).
    #[arg(long)]
    netns: bool,
    /// `tc netem` arguments for each server's egress, e.g. "delay 100us 20us loss 0.01%".
    #[arg(long, requires = "netns", conflicts_with = "server_qdisc")]
    netem: Option<String>,
    /// `tc netem` arguments for the switch port towards the reader (where an incast converges).
    #[arg(long, requires = "netns", conflicts_with = "client_qdisc")]
    client_netem: Option<String>,
    /// Any `tc` root qdisc (kind + arguments) for each server's egress, e.g. "tbf rate 1gbit burst 64kb latency 1ms".
    #[arg(long, requires = "netns")]
    server_qdisc: Option<String>,
    /// Any `tc` root qdisc for the switch port towards the reader (the incast bottleneck).
    #[arg(long, requires = "netns")]
    client_qdisc: Option<String>,
    /// How servers wait for work.
    #[arg(long, value_enum, default_value_t = Idle::Block)]
    server_idle: Idle,
    /// Address servers listen on without --netns.
    #[arg(long, default_value = "127.0.0.1")]
    listen_host: String,
}

#[derive(Args)]
struct ServeArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    transport: TransportKind,
    /// Listen address (tcp/rdma: HOST:PORT, port 0 = any; shm: Unix socket path or @name).
    #[arg(long, short = 'l')]
    listen: Option<String>,
    #[command(flatten)]
    shape: Shape,
    /// Server id (announced in the catalog).
    #[arg(long, default_value_t = 0)]
    id: u32,
    /// How to wait for work.
    #[arg(long, value_enum, default_value_t = Idle::Block)]
    idle: Idle,
    /// Exit when the parent process exits (used by `netbench local`).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Stop once this many clients have connected and left.
    #[arg(long)]
    exit_after_clients: Option<u64>,
}

#[derive(Args)]
struct IncastArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    transport: TransportKind,
    /// Server addresses, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    peers: Vec<String>,
    #[command(flatten)]
    shape: Shape,
    #[command(flatten)]
    measure: Measure,
    #[command(flatten)]
    output: Output,
    /// Describes the fabric in reports.
    #[arg(long)]
    fabric: Option<String>,
}

#[derive(Args)]
struct LocalArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    transport: TransportKind,
    #[command(flatten)]
    local: LocalOpts,
    #[command(flatten)]
    shape: Shape,
    #[command(flatten)]
    measure: Measure,
    #[command(flatten)]
    output: Output,
}

#[derive(Args)]
struct CalibrateArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    transport: TransportKind,
    /// Server addresses (default: start --servers local servers).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    #[command(flatten)]
    local: LocalOpts,
    #[command(flatten)]
    shape: Shape,
    #[command(flatten)]
    measure: Measure,
    /// Percentile of the bound.
    #[arg(long, default_value_t = 99.99)]
    percentile: f64,
    /// Batch sizes (READs per round) [default: 1, 2, 4, ... up to peers x objects].
    #[arg(long, value_delimiter = ',')]
    batches: Vec<usize>,
    /// Where to write the delay file.
    #[arg(long, short = 'o')]
    out: PathBuf,
    /// Add the fit's intercept (fixed cost of a round) to d_ctrl.
    #[arg(long)]
    fold_intercept: bool,
    /// Describes the fabric in the file.
    #[arg(long)]
    fabric: Option<String>,
    /// Also write each batch size's JSON report into this directory.
    #[arg(long)]
    save_dir: Option<PathBuf>,
    /// From the same measurement, also write files at these percentiles (OUT with `.pNN`
    /// before the extension, e.g. delay.p99.toml).
    #[arg(long, value_delimiter = ',')]
    extra_percentiles: Vec<f64>,
}

#[derive(Args)]
struct PlotArgs {
    /// JSON reports (from --json or --save).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output SVG file.
    #[arg(long, short = 'o')]
    out: PathBuf,
    /// Metrics to draw, one panel each (round, read, ctrl_rtt) [default: all present].
    #[arg(long, value_delimiter = ',')]
    metric: Vec<String>,
    /// Linear latency axis (default: log).
    #[arg(long)]
    linear_y: bool,
    /// Figure title.
    #[arg(long, default_value = "netbench: latency by percentile")]
    title: String,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Serve(a) => cmd_serve(a),
        Cmd::Incast(a) => cmd_incast(a),
        Cmd::Local(a) => cmd_local(a),
        Cmd::Calibrate(a) => cmd_calibrate(a),
        Cmd::Plot(a) => cmd_plot(a),
    };
    if let Err(f) = r {
        eprintln!("netbench: error: {}", f.msg);
        std::process::exit(f.code);
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Longest READ a transport takes, known before opening it.
fn max_read_for(kind: TransportKind) -> u32 {
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
    server::check_shape(
        a.shape.objects,
        a.shape.size,
        max_read_for(a.transport),
        a.shape.max_region,
        a.transport,
    )?;
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
    };
    server::serve(
        cfg,
        DomainOptions {
            read_timeout: ms(10_000),
        },
    )
}

fn bench_config(shape: &Shape, m: &Measure) -> Res<BenchConfig> {
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
struct RunPlans {
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

fn check_peers(peers: &[String]) -> Res<()> {
    if peers.is_empty() || peers.iter().any(|p| p.trim().is_empty()) {
        return Err(Fail::usage("--peers needs at least one non-empty address"));
    }
    Ok(())
}

fn report(
    kind: TransportKind,
    fabric: String,
    label: Option<String>,
    addrs: Vec<String>,
    cfg: &BenchConfig,
    inputs: usize,
    r: &RunResult,
) -> Res<Report> {
    let size = u64::from(cfg.size);
    let label = label.unwrap_or_else(|| {
        format!(
            "{} {}x{}x{}B",
            kind.name(),
            addrs.len(),
            cfg.objects,
            cfg.size
        )
    });
    Ok(Report {
        tool: "netbench".to_string(),
        format: 1,
        label,
        transport: kind.name().to_string(),
        fabric,
        peers: addrs,
        objects: cfg.objects,
        size: cfg.size,
        inputs_per_round: inputs,
        concurrency: cfg.concurrency,
        iterations: cfg.iters,
        warmup: cfg.warmup,
        verified_reads: r.verified,
        host: stats::hostname(),
        unix_time: stats::unix_time(),
        command: std::env::args().collect(),
        metrics: vec![
            r.round.summary("round", inputs as u64 * size)?,
            r.read.summary("read", size)?,
            r.ctrl.summary("ctrl_rtt", cfg.ping_size as u64)?,
        ],
    })
}

fn emit(rep: &Report, out: &Output) -> Res<()> {
    let json = serde_json::to_string_pretty(rep).map_err(|e| Fail::runtime(e.to_string()))?;
    if let Some(p) = &out.save {
        std::fs::write(p, &json)
            .map_err(|e| Fail::runtime(format!("cannot write {}: {e}", p.display())))?;
    }
    if let Some(p) = &out.plot {
        let panels = panels_of(std::slice::from_ref(rep), &[])?;
        let svg = plot::svg(&format!("netbench: {}", rep.label), &panels, true);
        std::fs::write(p, svg)
            .map_err(|e| Fail::runtime(format!("cannot write {}: {e}", p.display())))?;
    }
    if out.json {
        println!("{json}");
    } else if out.csv {
        print!("{}", stats::csv(rep));
    } else {
        print!("{}", stats::table(rep));
    }
    Ok(())
}

fn cmd_incast(a: IncastArgs) -> Res<()> {
    check_peers(&a.peers)?;
    let cfg = bench_config(&a.shape, &a.measure)?;
    let (inputs, res) = run_full_incast(a.transport, &a.peers, &cfg, a.shape.max_region)?;
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

fn local_options(kind: TransportKind, l: &LocalOpts, shape: &Shape) -> local::LocalOptions {
    local::LocalOptions {
        kind,
        servers: l.servers,
        objects: shape.objects,
        size: shape.size,
        idle: l.server_idle,
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
    }
}

/// Notes on stderr what a single host does to the numbers.
fn note_oversubscription(servers: usize, idle: Idle, kind: TransportKind) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if idle == Idle::Spin && servers + 1 > cores {
        eprintln!(
            "netbench: note: {servers} spinning servers + 1 reader on {cores} cores: \
             expect scheduler preemption in the tails (--server-idle block avoids it)"
        );
    }
    if kind == TransportKind::Rdma && idle == Idle::Block {
        eprintln!(
            "netbench: note: rdma servers cannot block in the kernel; when idle they back off to \
             sleeps (50 us, then 1 ms), which inflates ctrl_rtt (READs need no server CPU); \
             use --server-idle spin with a spare core per server to measure ctrl_rtt"
        );
    }
}

fn cmd_local(a: LocalArgs) -> Res<()> {
    let cfg = bench_config(&a.shape, &a.measure)?;
    server::check_shape(
        a.shape.objects,
        a.shape.size,
        max_read_for(a.transport),
        a.shape.max_region,
        a.transport,
    )?;
    let lo = local_options(a.transport, &a.local, &a.shape);
    note_oversubscription(lo.servers, lo.idle, lo.kind);
    let servers = local::LocalServers::start(&lo)?;
    servers.enter_client_netns()?;
    let (inputs, res) = run_full_incast(a.transport, &servers.addrs, &cfg, a.shape.max_region)?;
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

fn cmd_calibrate(a: CalibrateArgs) -> Res<()> {
    calibrate::check_percentile(a.percentile)?;
    let cfg = bench_config(&a.shape, &a.measure)?;
    if cfg.ping_every == 0 {
        return Err(Fail::usage(
            "calibrate measures d_ctrl from control round trips: --ping-every must be at least 1",
        ));
    }
    server::check_shape(
        a.shape.objects,
        a.shape.size,
        max_read_for(a.transport),
        a.shape.max_region,
        a.transport,
    )?;
    let lo = local_options(a.transport, &a.local, &a.shape);
    let (servers, addrs, fabric) = if a.peers.is_empty() {
        note_oversubscription(lo.servers, lo.idle, lo.kind);
        let s = local::LocalServers::start(&lo)?;
        let addrs = s.addrs.clone();
        let fabric = s.fabric(&lo);
        (Some(s), addrs, fabric)
    } else {
        check_peers(&a.peers)?;
        let f = format!("{} peer(s)", a.peers.len());
        (None, a.peers.clone(), f)
    };
    if let Some(s) = &servers {
        s.enter_client_netns()?;
    }
    let max_b = addrs.len() * cfg.objects as usize;
    let batches = if a.batches.is_empty() {
        calibrate::default_batches(max_b)
    } else {
        a.batches.clone()
    };
    if batches.contains(&0) {
        return Err(Fail::usage(
            "--batches: every batch size must be at least 1",
        ));
    }
    let plans: Vec<Vec<Input>> = batches
        .iter()
        .map(|&b| client::batch_plan(addrs.len(), cfg.objects, b))
        .collect();
    let task = RunPlans {
        addrs: addrs.clone(),
        cfg: cfg.clone(),
        plans,
        max_region: a.shape.max_region,
        kind: a.transport,
    };
    let results = transport::with_domain(
        a.transport,
        DomainOptions {
            read_timeout: cfg.round_timeout,
        },
        task,
    )?;
    drop(servers);

    let fabric = a
        .fabric
        .unwrap_or_else(|| format!("{} ({fabric})", a.transport.name()));
    let mut ctrl = stats::Recorder::new();
    eprintln!(
        "{:>6} {:>8} {:>14} {:>14}",
        "b",
        "rounds",
        "p50[usec]",
        format!("p{}[usec]", a.percentile)
    );
    for (b, r) in batches.iter().zip(&results) {
        ctrl.merge(&r.ctrl);
        eprintln!(
            "{:>6} {:>8} {:>14.2} {:>14.2}",
            b,
            r.round.count(),
            r.round.percentile_ns(50.0) as f64 / 1000.0,
            r.round.percentile_ns(a.percentile) as f64 / 1000.0
        );
        if let Some(dir) = &a.save_dir {
            let rep = report(
                a.transport,
                fabric.clone(),
                Some(format!("{} b={b}", a.transport.name())),
                addrs.clone(),
                &cfg,
                *b,
                r,
            )?;
            let json =
                serde_json::to_string_pretty(&rep).map_err(|e| Fail::runtime(e.to_string()))?;
            let p = dir.join(format!("calibrate-{}-b{b}.json", a.transport.name()));
            std::fs::write(&p, json)
                .map_err(|e| Fail::runtime(format!("cannot write {}: {e}", p.display())))?;
        }
    }
    let mut outputs = vec![(a.percentile, a.out.clone())];
    for &p in &a.extra_percentiles {
        calibrate::check_percentile(p)?;
        let stem = a
            .out
            .file_stem()
            .map_or("delay".into(), |s| s.to_string_lossy().into_owned());
        let ext = a
            .out
            .extension()
            .map_or("toml".into(), |s| s.to_string_lossy().into_owned());
        outputs.push((p, a.out.with_file_name(format!("{stem}.p{p}.{ext}"))));
    }
    for (pct, path) in outputs {
        let points = batches
            .iter()
            .zip(&results)
            .map(|(b, r)| calibrate::Point {
                b: *b,
                rounds: r.round.count(),
                p50_us: r.round.percentile_ns(50.0) as f64 / 1000.0,
                pct_us: r.round.percentile_ns(pct) as f64 / 1000.0,
            })
            .collect();
        let cal = calibrate::Calibration {
            percentile: pct,
            ctrl_rtt_us: ctrl.percentile_ns(pct) as f64 / 1000.0,
            ctrl_bytes: cfg.ping_size,
            points,
            fabric: fabric.clone(),
            fold_intercept: a.fold_intercept,
            size: cfg.size,
            provenance: vec![
                format!(
                    "written by: {}",
                    std::env::args().collect::<Vec<_>>().join(" ")
                ),
                format!(
                    "host {} ({} cores) at {}; {} rounds per batch size after {} warm-up",
                    stats::hostname(),
                    std::thread::available_parallelism().map_or(0, |n| n.get()),
                    stats::utc(stats::unix_time()),
                    cfg.iters,
                    cfg.warmup
                ),
            ],
        };
        let text = cal.to_toml()?;
        std::fs::write(&path, &text)
            .map_err(|e| Fail::runtime(format!("cannot write {}: {e}", path.display())))?;
        let (d_ctrl, d_data, _) = cal.values()?;
        println!(
            "wrote {}: d_ctrl_us = {d_ctrl:.3} (half the p{pct} control round trip), d_data_us = {d_data:.3} (slope of p{pct} round time per input)",
            path.display(),
        );
    }
    Ok(())
}

const METRIC_TITLES: [(&str, &str); 3] = [
    ("round", "incast round (all READs of a batch)"),
    ("read", "one READ, post to completion"),
    ("ctrl_rtt", "control message round trip"),
];

fn panels_of(reports: &[Report], wanted: &[String]) -> Res<Vec<plot::Panel>> {
    let names: Vec<String> = if wanted.is_empty() {
        let mut v: Vec<String> = Vec::new();
        for r in reports {
            for m in &r.metrics {
                if !v.contains(&m.name) {
                    v.push(m.name.clone());
                }
            }
        }
        v
    } else {
        wanted.to_vec()
    };
    let mut panels = Vec::new();
    for name in names {
        let mut series = Vec::new();
        for r in reports {
            if let Some(m) = r.metrics.iter().find(|m| m.name == name) {
                if m.histogram_unit != "ns" {
                    return Err(Fail::runtime(format!(
                        "{}: histogram unit {:?} (expected ns)",
                        r.label, m.histogram_unit
                    )));
                }
                series.push(plot::Series {
                    label: r.label.clone(),
                    hist: stats::decode_hist(&m.histogram)?,
                });
            }
        }
        if series.is_empty() {
            return Err(Fail::usage(format!(
                "no report has a metric named {name:?} (round, read, ctrl_rtt)"
            )));
        }
        let title = METRIC_TITLES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(name.clone(), |(n, t)| format!("{n}: {t}"));
        panels.push(plot::Panel { title, series });
    }
    Ok(panels)
}

fn cmd_plot(a: PlotArgs) -> Res<()> {
    let mut reports = Vec::new();
    for f in &a.files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Fail::runtime(format!("cannot read {}: {e}", f.display())))?;
        let r: Report = serde_json::from_str(&text).map_err(|e| {
            Fail::runtime(format!(
                "{} is not a netbench JSON report: {e}",
                f.display()
            ))
        })?;
        reports.push(r);
    }
    let panels = panels_of(&reports, &a.metric)?;
    let svg = plot::svg(&a.title, &panels, !a.linear_y);
    std::fs::write(&a.out, svg)
        .map_err(|e| Fail::runtime(format!("cannot write {}: {e}", a.out.display())))?;
    eprintln!(
        "wrote {} ({} panel(s), {} run(s))",
        a.out.display(),
        panels.len(),
        reports.len()
    );
    Ok(())
}
