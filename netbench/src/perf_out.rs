//! `netbench lat`/`bw`: the command (servers, run), its report (JSON, one
//! entry per size), perftest's tables, CSV, and SVGs of whole sweeps
//! (`--svg`, `netbench sweep-plot`).

use serde::{Deserialize, Serialize};

use crate::args::{PerfArgs, SweepPlotArgs};
use crate::fail::{Fail, Res};
use crate::perf::{self, BwStats, LoadSpec, PerfConfig, PerfRun, SizeResult, Stop, Test, Verb};
use crate::server::Idle;
use crate::stats::{self, Metric};
use crate::transport::{self, DomainOptions, TransportKind};

/// What each verb is on each transport (the `lat`/`bw` help's epilogue).
pub const VERB_HELP: &str = "\
Verbs per transport:
  read   rdma: RDMA READ work requests. tcp, tcp-blocking: a (key, offset, len) request
         answered from the server's registered region by its responder. shm: a
         bounds-checked copy out of the server's mapped region. Latency = post to
         completion (the round trip, as ib_read_lat).
  write  rdma (netbench built with --features rdma): lat is a WRITE ping-pong, as
         ib_write_lat: on each connection's second (raw) queue pair client and server swap
         the address and rkey of a remote-writable buffer, the client RDMA-WRITEs the size's
         bytes into the server's (the last byte carrying an iteration marker), the server
         busy-polls that byte and WRITEs the bytes back, the client busy-polls its own last
         byte; latency = half that round trip; WRITEs of at most 236 bytes go inline; the
         bytes that came back are checked. bw: RDMA WRITE work requests into the server's
         object (local servers register it remote-writable; start a remote one with
         `netbench serve --writable`), each complete at its completion (the RC ack).
         tcp, tcp-blocking, shm: EMULATED - the bytes travel as messages on the connection
         (chunks of at most 32 KiB) and the server's CPU copies them to the operation's
         offset in its buffer, then answers.
  send   rdma, netbench built with --features rdma: one raw verbs SEND per operation (any
         size up to 8 MiB, no header, no copy) of a registered buffer, on a second queue pair
         per connection, into receives of a registered buffer the server keeps posted
         (--rx-depth, default 512), as ib_send_lat/ib_send_bw; every SEND signalled, those of
         at most 236 bytes inline; lat: the server answers each SEND with its bytes. rdma
         otherwise: SENDs on the control channel (112-byte header, at most 32 KiB each, an
         operation over 32 KiB is several SENDs). tcp, tcp-blocking, shm: EMULATED - the
         bytes travel as messages as for write and the server lands them in its receive
         buffer.
  lat of write and of send = half the ping-pong round trip (the server answers every
  operation with one of the same size), as ib_write_lat and ib_send_lat report.
  bw: --tx-depth operations in flight per queue pair. A READ or rdma WRITE completes at its
  completion; an emulated WRITE at the server's acknowledgement. SEND is answered by
  nothing, as ib_send_bw: flow control is the transport's (rdma: the server's receive ring,
  receiver-not-ready retries, the send queue; tcp: socket buffers; shm: the ring); an rdma
  SEND completes at its work completion (the RC acknowledgement: the bytes are in a receive
  slot; netbench built with --features rdma), elsewhere when the transport accepted it, and
  the run then ends when the server answers a final tally; the tally must count every
  operation sent. With --bidirectional the server answers every WRITE or SEND with one of the
  same size; an operation completes at that answer and both directions count.
  BW average = bytes of completed operations / (first post .. last completion); BW peak = the
  fastest tenth of the run's completions; MB = 2^20 bytes (perftest's MB/sec); MsgRate in
  millions of operations per second.
Device, port and GID (rdma): -d, -i, -x as perftest's. Like perftest's defaults (rdma): READs
  on the wire SYMPHONY_RDMA_READ_DEPTH=128, work requests in flight SYMPHONY_RDMA_MAX_READS=128,
  SENDs in flight SYMPHONY_RDMA_SEND_SLOTS=128, and SYMPHONY_RDMA_BUSY_POLL=1 (empty polls arm
  no completion events).";

/// The report's machine facts as one line (the JSON's `machine` object).
fn machine_line(m: &serde_json::Value) -> String {
    let field = |k: &str| m.get(k).map_or("unknown".to_string(), |v| match v {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    });
    format!(
        "machine: {}, {} cores, kernel {}",
        field("processor"),
        field("cores"),
        field("kernel")
    )
}

/// One size of a bandwidth test, in perftest's columns.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BwRow {
    /// Bytes per operation.
    pub bytes: u64,
    /// Operations completed.
    pub iterations: u64,
    /// Fastest tenth of the run, MB/s (MB = 2^20 bytes).
    pub bw_peak_mb_s: f64,
    /// Whole run, MB/s.
    pub bw_avg_mb_s: f64,
    /// Millions of operations per second.
    pub msg_rate_mpps: f64,
    /// First post to last completion, seconds.
    pub elapsed_s: f64,
}

impl From<&BwStats> for BwRow {
    fn from(b: &BwStats) -> Self {
        const MB: f64 = (1u64 << 20) as f64;
        BwRow {
            bytes: u64::from(b.bytes),
            iterations: b.ops,
            bw_peak_mb_s: b.peak_bytes_per_s / MB,
            bw_avg_mb_s: b.avg_bytes_per_s() / MB,
            msg_rate_mpps: b.ops_per_s() / 1e6,
            elapsed_s: b.elapsed_ns as f64 / 1e9,
        }
    }
}

/// `lat --under-load`: the same sizes measured again beside a stream.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UnderLoad {
    /// The stream's operation.
    pub verb: Verb,
    /// Its bytes per operation.
    pub size: u32,
    /// Its operations in flight.
    pub tx_depth: usize,
    /// Latency with the stream running, one entry per size.
    pub lat: Vec<Metric>,
    /// What the stream achieved while each size was measured.
    pub load_bw: Vec<BwRow>,
}

/// The JSON report of a `lat`/`bw` run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PerfReport {
    /// "netbench".
    pub tool: String,
    /// Report format version.
    pub format: u32,
    /// "lat" or "bw".
    pub test: String,
    /// The operation.
    pub verb: Verb,
    /// Transport name.
    pub transport: String,
    /// What the verb is on this transport.
    pub semantics: String,
    /// Name of the run.
    pub label: String,
    /// Where the servers ran.
    pub fabric: String,
    /// Server addresses.
    pub peers: Vec<String>,
    /// Connections per server.
    pub queue_pairs: usize,
    /// Operations in flight per queue pair (bw).
    pub tx_depth: Option<usize>,
    /// READ/WRITE work requests per post call (bw; absent in reports before it).
    #[serde(default)]
    pub post_list: Option<usize>,
    /// bw: both directions.
    pub bidirectional: bool,
    /// -n, if given (or its default).
    pub iterations: Option<u64>,
    /// -D, if given.
    pub duration_s: Option<f64>,
    /// Unmeasured iterations per size.
    pub warmup: u64,
    /// Host of the client.
    pub host: String,
    /// The client machine's processor, cores, kernel and the run's process
    /// layout (`dataplane::machine`; absent in reports of older versions).
    #[serde(default)]
    pub machine: Option<serde_json::Value>,
    /// When the run ended.
    pub unix_time: u64,
    /// The command line.
    pub command: Vec<String>,
    /// lat: one entry per size (perftest's columns plus 99.99%, µs; histograms in ns).
    #[serde(default)]
    pub lat: Vec<Metric>,
    /// lat --under-load.
    #[serde(default)]
    pub under_load: Option<UnderLoad>,
    /// bw: one entry per size.
    #[serde(default)]
    pub bw: Vec<BwRow>,
}

/// What `verb` is on `kind` (one line of [`VERB_HELP`]).
pub fn semantics(kind: TransportKind, test: Test, verb: Verb) -> &'static str {
    match (kind, verb) {
        (TransportKind::Rdma, Verb::Read) => "RDMA READ work requests",
        (TransportKind::Rdma, Verb::Write) if test == Test::Lat => {
            "RDMA WRITE ping-pong on a second queue pair (each side WRITEs into the other's \
             remote-writable buffer and polls its own last byte, as ib_write_lat); latency = \
             half the round trip"
        }
        (TransportKind::Rdma, Verb::Write) => {
            "RDMA WRITE work requests into the server's remote-writable object, each complete at its completion"
        }
        (TransportKind::Rdma, Verb::Send) if cfg!(feature = "rdma") => {
            "one raw verbs SEND of a registered buffer per operation (second queue pair, no \
             header, no copy) into receives the server posted in advance; bw: no answers, a final tally"
        }
        (TransportKind::Rdma, Verb::Send) => {
            "verbs SENDs on the control channel, 32 KiB each at most, into receives posted in \
             advance; bw: no answers, a final tally"
        }
        (TransportKind::Shm, Verb::Read) => "bounds-checked copy out of the server's mapped region",
        (_, Verb::Read) => "request answered by the server's READ responder",
        (_, Verb::Write) => {
            "emulated: messages of <= 32 KiB landed by the server's CPU at the operation's offset"
        }
        (_, Verb::Send) => {
            "emulated: messages of <= 32 KiB landed by the server's CPU in its receive buffer; \
             bw: no answers, complete when the transport took them, the run ends at a final tally"
        }
    }
}

fn iterations_default(test: Test) -> u64 {
    match test {
        Test::Lat => 1000,
        Test::Bw => 5000,
    }
}

/// `netbench lat` / `netbench bw`.
pub(crate) fn cmd_perf(a: PerfArgs, test: Test) -> Res<()> {
    let cfg = perf_config(&a, test)?;
    let largest = cfg.max_size();
    let max_read = crate::max_read_for(a.transport);
    if largest > max_read {
        return Err(Fail::usage(format!(
            "size {largest}: larger than the {} transport's longest operation ({max_read} bytes)",
            a.transport.name()
        )));
    }
    if a.transport == TransportKind::Rdma
        && (cfg.verb == Verb::Send || (cfg.verb == Verb::Write && test == Test::Lat))
    {
        let depth = (cfg.tx_depth as u32).max(cfg.rx_depth);
        crate::server_raw::ask_raw_depth(depth.max(crate::server_raw::SERVE_RAW_DEPTH));
    }
    let (servers, addrs, fabric) = start_servers(&a, &cfg, largest)?;
    let (results, endpoint) = transport::with_domain(
        a.transport,
        DomainOptions {
            read_timeout: dataplane::time::Duration::from_millis(a.op_timeout_ms),
        },
        PerfRun {
            addrs: addrs.clone(),
            cfg: cfg.clone(),
        },
    )
    .map_err(|e| name_selection(&a, e))?;
    drop(servers);
    let fabric = match endpoint {
        Some(e) => format!("{fabric}; {e}"),
        None => fabric,
    };
    let rep = build_report(&a, &cfg, fabric, addrs, &results)?;
    emit(&rep, &a)
}

/// The measurement the arguments ask for, checked.
fn perf_config(a: &PerfArgs, test: Test) -> Res<PerfConfig> {
    let sizes = if a.all_sizes {
        perf::all_sizes()
    } else {
        vec![a.size]
    };
    if a.queue_pairs == 0 || a.queue_pairs > 1024 {
        return Err(Fail::usage("--qp must be 1..=1024"));
    }
    if a.tx_depth == 0 || a.tx_depth > 4096 {
        return Err(Fail::usage("--tx-depth must be 1..=4096"));
    }
    if a.post_list == 0 || a.post_list > perf::POST_AT_ONCE {
        return Err(Fail::usage(format!("--post-list must be 1..={}", perf::POST_AT_ONCE)));
    }
    if a.bidirectional && (test == Test::Lat || a.verb == Verb::Read) {
        return Err(Fail::usage(
            "--bidirectional applies to bw with --verb write or send (a READ's bytes flow one way; \
             the server starts no READs)",
        ));
    }
    if a.under_load && test == Test::Bw {
        return Err(Fail::usage("--under-load applies to lat"));
    }
    if a.iters == Some(0) {
        return Err(Fail::usage("-n must be at least 1"));
    }
    let stop = match a.duration {
        Some(s) if !(s.is_finite() && s > 0.0 && s <= 3600.0) => {
            return Err(Fail::usage(
                "-D must be a positive number of seconds, at most 3600",
            ))
        }
        Some(s) => Stop::For(std::time::Duration::from_secs_f64(s)),
        None => Stop::Count(a.iters.unwrap_or(iterations_default(test))),
    };
    if a.connect_timeout_ms == 0 || a.op_timeout_ms == 0 {
        return Err(Fail::usage("timeouts must be at least 1 ms"));
    }
    let warmup = a.warmup.unwrap_or(match (test, stop) {
        (Test::Lat, Stop::Count(n)) => (n / 10).clamp(1, 100),
        (Test::Lat, Stop::For(_)) => 100,
        (Test::Bw, _) => a.tx_depth as u64,
    });
    let under_load = a.under_load.then(|| LoadSpec {
        verb: a.load_verb.unwrap_or(a.verb),
        size: a.load_size,
        tx_depth: a.load_depth.max(1),
    });
    let cfg = PerfConfig {
        test,
        verb: a.verb,
        sizes,
        stop,
        warmup,
        queue_pairs: a.queue_pairs,
        tx_depth: a.tx_depth,
        post_list: a.post_list,
        bidirectional: a.bidirectional,
        rx_depth: a.rx_depth.unwrap_or(crate::server_raw::SERVE_RAW_DEPTH),
        under_load,
        connect_timeout: dataplane::time::Duration::from_millis(a.connect_timeout_ms),
        op_timeout: std::time::Duration::from_millis(a.op_timeout_ms),
    };
    Ok(cfg)
}

/// Starts the local servers (none with `--peers`): the servers' guard, their
/// addresses and the fabric's description.
fn start_servers(
    a: &PerfArgs,
    cfg: &PerfConfig,
    largest: u32,
) -> Res<(Option<crate::local::LocalServers>, Vec<String>, String)> {
    let under_load = cfg.under_load;
    let rdma = a.rdma();
    rdma.select();
    let out = if a.peers.is_empty() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let idle = a
            .server_idle
            .unwrap_or(if a.servers() + 1 + usize::from(a.under_load) <= cores {
                Idle::Spin
            } else {
                Idle::Block
            });
        let lo = crate::local::LocalOptions {
            kind: a.transport,
            servers: a.servers(),
            objects: 1,
            size: largest,
            idle,
            rdma,
            listen_host: a.listen_host.clone(),
            netns: false,
            server_qdisc: None,
            client_qdisc: None,
            max_region: u64::from(largest).max(1 << 30),
            writable: a.verb == Verb::Write || under_load.is_some_and(|l| l.verb == Verb::Write),
            recv_slots: a.rx_depth.or((cfg.test == Test::Bw && a.verb == Verb::Send).then_some(512)),
        };
        crate::note_oversubscription(lo.servers, lo.idle, lo.kind);
        let s = crate::local::LocalServers::start(&lo).map_err(|e| name_selection(a, e))?;
        let addrs = s.addrs.clone();
        let fabric = s.fabric(&lo);
        (Some(s), addrs, fabric)
    } else {
        crate::check_peers(&a.peers)?;
        let f = format!("{} server(s) over {}", a.peers.len(), a.transport.name());
        (None, a.peers.clone(), f)
    };
    Ok(out)
}

/// Names the RDMA selection in an rdma failure (the transport's own message
/// does not say which device, port or GID it was asked for).
fn name_selection(a: &PerfArgs, e: Fail) -> Fail {
    if a.transport != TransportKind::Rdma {
        return e;
    }
    e.context(format!(
        "rdma device {}, port {}, GID index {}",
        a.rdma_device.as_deref().unwrap_or("(first active)"),
        a.rdma_port.map_or("1".to_string(), |p| p.to_string()),
        a.gid_index.map_or("(auto)".to_string(), |g| g.to_string())
    ))
}

/// The machine's facts with this run's processes (none is pinned).
fn machine_facts(a: &PerfArgs, cfg: &PerfConfig) -> dataplane::machine::MachineFacts {
    use dataplane::machine::Placement;
    let mut layout = vec![Placement::unpinned("client")];
    if cfg.under_load.is_some() {
        layout.push(Placement::unpinned("load stream"));
    }
    if a.peers.is_empty() {
        layout.push(Placement::unpinned(format!("{} local server(s)", a.servers())));
    }
    dataplane::machine::facts(layout)
}

fn build_report(
    a: &PerfArgs,
    cfg: &PerfConfig,
    fabric: String,
    peers: Vec<String>,
    results: &[SizeResult],
) -> Res<PerfReport> {
    let test = cfg.test;
    let mut lat = Vec::new();
    let mut bw = Vec::new();
    let mut loaded = Vec::new();
    let mut load_bw = Vec::new();
    for r in results {
        if let Some(l) = &r.lat {
            lat.push(l.summary("lat", u64::from(r.bytes))?);
        }
        if let Some(l) = &r.lat_loaded {
            loaded.push(l.summary("lat_under_load", u64::from(r.bytes))?);
        }
        if let Some(b) = &r.bw {
            bw.push(BwRow::from(b));
        }
        if let Some(b) = &r.load_bw {
            load_bw.push(BwRow::from(b));
        }
    }
    let test_name = if test == Test::Lat { "lat" } else { "bw" };
    Ok(PerfReport {
        tool: "netbench".to_string(),
        format: 1,
        test: test_name.to_string(),
        verb: cfg.verb,
        transport: a.transport.name().to_string(),
        semantics: semantics(a.transport, test, cfg.verb).to_string(),
        label: a
            .label
            .clone()
            .unwrap_or_else(|| format!("{} {}", a.transport.name(), cfg.verb.name())),
        fabric,
        peers,
        queue_pairs: cfg.queue_pairs,
        tx_depth: (test == Test::Bw).then_some(cfg.tx_depth),
        post_list: (test == Test::Bw).then_some(cfg.post_list),
        bidirectional: cfg.bidirectional,
        iterations: match cfg.stop {
            Stop::Count(n) => Some(n),
            Stop::For(_) => None,
        },
        duration_s: match cfg.stop {
            Stop::For(d) => Some(d.as_secs_f64()),
            Stop::Count(_) => None,
        },
        warmup: cfg.warmup,
        host: stats::hostname(),
        machine: serde_json::from_str(&machine_facts(a, cfg).to_json()).ok(),
        unix_time: stats::unix_time(),
        command: std::env::args().collect(),
        lat,
        under_load: cfg.under_load.map(|l| UnderLoad {
            verb: l.verb,
            size: l.size,
            tx_depth: l.tx_depth,
            lat: loaded,
            load_bw,
        }),
        bw,
    })
}

fn emit(rep: &PerfReport, a: &PerfArgs) -> Res<()> {
    let json = serde_json::to_string_pretty(rep)?;
    a.form.save(&json)?;
    if let Some(p) = &a.svg {
        let svg = sweep_svg(
            &format!("netbench {}: {}", rep.test, rep.label),
            std::slice::from_ref(rep),
        );
        std::fs::write(p, svg).map_err(Fail::write(p.clone()))?;
    }
    a.form.print(&json, || table(rep), || csv(rep));
    Ok(())
}

use crate::stats::COLUMNS as LAT_COLUMNS;

const BW_COLUMNS: [&str; 5] = [
    "#bytes",
    "#iterations",
    "BW peak[MB/sec]",
    "BW average[MB/sec]",
    "MsgRate[Mpps]",
];

fn lat_rows(out: &mut String, rows: &[Metric]) {
    for c in LAT_COLUMNS {
        out.push_str(&format!(" {c:>w$}", w = c.len().max(9)));
    }
    out.push('\n');
    for m in rows {
        for (c, v) in LAT_COLUMNS.iter().zip(m.cells()) {
            out.push_str(&format!(" {v:>w$}", w = c.len().max(9)));
        }
        out.push('\n');
    }
}

fn bw_rows(out: &mut String, rows: &[BwRow]) {
    for c in BW_COLUMNS {
        out.push_str(&format!(" {c:>w$}", w = c.len().max(9)));
    }
    out.push('\n');
    for b in rows {
        let cells = [
            b.bytes.to_string(),
            b.iterations.to_string(),
            format!("{:.2}", b.bw_peak_mb_s),
            format!("{:.2}", b.bw_avg_mb_s),
            format!("{:.6}", b.msg_rate_mpps),
        ];
        for (c, v) in BW_COLUMNS.iter().zip(cells) {
            out.push_str(&format!(" {v:>w$}", w = c.len().max(9)));
        }
        out.push('\n');
    }
}

/// perftest's table(s).
pub fn table(r: &PerfReport) -> String {
    let line = "-".repeat(120);
    let mut out = format!("{line}\n");
    out.push_str(&format!(
        " netbench {} | verb {} over {} ({}) | {} | {} server(s) x {} QP(s){} | {}\n",
        r.test,
        r.verb.name(),
        r.transport,
        r.semantics,
        r.fabric,
        r.peers.len(),
        r.queue_pairs,
        r.tx_depth
            .map_or(String::new(), |d| format!(", tx depth {d}")),
        match (r.iterations, r.duration_s) {
            (_, Some(d)) => format!("{d} s per size"),
            (Some(n), None) => format!("{n} iterations per size"),
            (None, None) => String::new(),
        }
    ));
    if let Some(m) = &r.machine {
        out.push_str(&format!(" {}\n", machine_line(m)));
    }
    out.push_str(&format!("{line}\n"));
    if r.test == "lat" {
        if r.under_load.is_some() {
            out.push_str(" without load:\n");
        }
        lat_rows(&mut out, &r.lat);
    } else {
        if r.bidirectional {
            out.push_str(" bidirectional: both directions counted\n");
        }
        bw_rows(&mut out, &r.bw);
    }
    if let Some(u) = &r.under_load {
        out.push_str(&format!(
            "{line}\n under load ({} {} B x {} in flight on one more connection per server):\n",
            u.verb.name(),
            u.size,
            u.tx_depth
        ));
        lat_rows(&mut out, &u.lat);
        out.push_str(" the load stream meanwhile:\n");
        bw_rows(&mut out, &u.load_bw);
    }
    out.push_str(&format!("{line}\n"));
    out
}

/// CSV: one row per size (and per load condition for --under-load).
pub fn csv(r: &PerfReport) -> String {
    let mut out = String::new();
    if r.test == "lat" {
        out.push_str("transport,verb,load,bytes,iterations,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p99_us,p99_9_us,p99_99_us\n");
        let mut rows: Vec<(&str, &Metric)> = r.lat.iter().map(|m| ("none", m)).collect();
        if let Some(u) = &r.under_load {
            rows.extend(u.lat.iter().map(|m| ("stream", m)));
        }
        for (load, m) in rows {
            out.push_str(&format!(
                "{},{},{load},{}\n",
                r.transport,
                r.verb.name(),
                m.csv_cells()
            ));
        }
    } else {
        out.push_str("transport,verb,bytes,iterations,bw_peak_mb_s,bw_avg_mb_s,msg_rate_mpps\n");
        for b in &r.bw {
            out.push_str(&format!(
                "{},{},{},{},{:.3},{:.3},{:.6}\n",
                r.transport,
                r.verb.name(),
                b.bytes,
                b.iterations,
                b.bw_peak_mb_s,
                b.bw_avg_mb_s,
                b.msg_rate_mpps
            ));
        }
    }
    out
}

/// One line of a sweep plot.
struct Line {
    label: String,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn size_label(b: f64) -> String {
    let b = b as u64;
    if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 {
        format!("{}K", b >> 10)
    } else {
        b.to_string()
    }
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One panel: log2 size on x, log10 value on y.
fn panel(out: &mut String, ox: f64, oy: f64, title: &str, y_unit: &str, lines: &[Line]) {
    let (w, h) = (560.0, 300.0);
    let pts = lines
        .iter()
        .flat_map(|l| l.points.iter())
        .filter(|p| p.0 > 0.0 && p.1 > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x.log2());
        x1 = x1.max(x.log2());
        y0 = y0.min(y.log10());
        y1 = y1.max(y.log10());
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        ox,
        oy - 8.0,
        esc(title)
    ));
    out.push_str(&format!(
        "<rect x=\"{ox:.1}\" y=\"{oy:.1}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#888\"/>\n"
    ));
    if x0 > x1 {
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">no data</text>\n",
            ox + 10.0,
            oy + 20.0
        ));
        return;
    }
    let (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
    let x1 = x1.max(x0 + 1.0);
    let sx = |x: f64| ox + (x.log2() - x0) / (x1 - x0) * w;
    let sy = |y: f64| oy + h - (y.log10() - y0) / (y1 - y0) * h;
    // Grid: decades on y, every other power of two on x.
    let mut d = y0;
    while d <= y1 {
        let y = sy(10f64.powf(d));
        out.push_str(&format!(
            "<line x1=\"{ox:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{}</text>\n",
            ox + w,
            ox - 4.0,
            y + 3.0,
            esc(&format!("{}", 10f64.powf(d)))
        ));
        d += 1.0;
    }
    let mut k = x0.floor() as i32;
    while f64::from(k) <= x1 {
        let x = sx(2f64.powi(k));
        out.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n",
            oy + h + 14.0,
            size_label(2f64.powi(k))
        ));
        k += 2;
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">bytes per operation</text>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" transform=\"rotate(-90 {:.1} {:.1})\" text-anchor=\"middle\">{}</text>\n",
        ox + w / 2.0,
        oy + h + 30.0,
        ox - 40.0,
        oy + h / 2.0,
        ox - 40.0,
        oy + h / 2.0,
        esc(y_unit)
    ));
    for (i, l) in lines.iter().enumerate() {
        let colour = COLOURS[(i / 2) % COLOURS.len()];
        let path: Vec<String> = l
            .points
            .iter()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if path.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\"{} points=\"{}\"/>\n",
            if l.dashed {
                " stroke-dasharray=\"4 3\""
            } else {
                ""
            },
            path.join(" ")
        ));
        let ly = oy + 14.0 + 14.0 * i as f64;
        out.push_str(&format!(
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{colour}\"{}/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>\n",
            ox + w + 10.0,
            ly - 3.0,
            ox + w + 30.0,
            ly - 3.0,
            if l.dashed { " stroke-dasharray=\"4 3\"" } else { "" },
            ox + w + 34.0,
            ly,
            esc(&l.label)
        ));
    }
}

/// An SVG of whole sweeps: latency (t_typical solid, 99% dashed; under load
/// as separate lines) and bandwidth (average solid, peak dashed) against
/// size, one line per report (verb and transport).
pub fn sweep_svg(title: &str, reports: &[PerfReport]) -> String {
    let mut lat = Vec::new();
    let mut bw = Vec::new();
    for r in reports {
        let name = format!("{} ({} {})", r.label, r.transport, r.verb.name());
        let pts = |rows: &[Metric], f: fn(&Metric) -> f64| {
            rows.iter().map(|m| (m.bytes as f64, f(m))).collect()
        };
        if !r.lat.is_empty() {
            lat.push(Line {
                label: format!("{name} typical"),
                dashed: false,
                points: pts(&r.lat, |m| m.t_typical),
            });
            lat.push(Line {
                label: format!("{name} 99%"),
                dashed: true,
                points: pts(&r.lat, |m| m.p99),
            });
        }
        if let Some(u) = &r.under_load {
            lat.push(Line {
                label: format!("{name} loaded typical"),
                dashed: false,
                points: pts(&u.lat, |m| m.t_typical),
            });
            lat.push(Line {
                label: format!("{name} loaded 99%"),
                dashed: true,
                points: pts(&u.lat, |m| m.p99),
            });
        }
        if !r.bw.is_empty() {
            let b = |f: fn(&BwRow) -> f64| r.bw.iter().map(|x| (x.bytes as f64, f(x))).collect();
            bw.push(Line {
                label: format!("{name} average"),
                dashed: false,
                points: b(|x| x.bw_avg_mb_s),
            });
            bw.push(Line {
                label: format!("{name} peak"),
                dashed: true,
                points: b(|x| x.bw_peak_mb_s),
            });
        }
    }
    let panels = usize::from(!lat.is_empty()) + usize::from(!bw.is_empty());
    let height = 80.0 + 370.0 * panels.max(1) as f64;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"980\" height=\"{height:.0}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"20\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
        esc(title)
    );
    let mut oy = 70.0;
    if !lat.is_empty() {
        panel(
            &mut out,
            70.0,
            oy,
            "latency (solid: t_typical, dashed: 99%)",
            "microseconds",
            &lat,
        );
        oy += 370.0;
    }
    if !bw.is_empty() {
        panel(
            &mut out,
            70.0,
            oy,
            "bandwidth (solid: average, dashed: peak)",
            "MB/s (2^20 B)",
            &bw,
        );
    }
    out.push_str("</svg>\n");
    out
}

/// `netbench sweep-plot`.
pub(crate) fn cmd_sweep_plot(a: SweepPlotArgs) -> Res<()> {
    let mut reports = Vec::new();
    for f in &a.files {
        let text = std::fs::read_to_string(f).map_err(Fail::read(f.clone()))?;
        let r: PerfReport = serde_json::from_str(&text).map_err(Fail::caused(format!("{} is not a netbench lat/bw JSON report", f.display())))?;
        reports.push(r);
    }
    std::fs::write(&a.out, sweep_svg(a.title.as_deref().unwrap_or("netbench: latency and bandwidth by size"), &reports)).map_err(Fail::write(a.out.clone()))?;
    tracing::info!("wrote {} ({} run(s))", a.out.display(), reports.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> PerfReport {
        let mut rec = stats::Recorder::new();
        for v in [1000, 2000, 3000] {
            rec.record(v);
        }
        PerfReport {
            tool: "netbench".into(),
            format: 1,
            test: "lat".into(),
            verb: Verb::Send,
            transport: "tcp".into(),
            semantics: semantics(TransportKind::Tcp, Test::Lat, Verb::Send).into(),
            label: "a<b".into(),
            fabric: "loopback".into(),
            peers: vec!["127.0.0.1:1".into()],
            queue_pairs: 1,
            tx_depth: None,
            post_list: None,
            bidirectional: false,
            iterations: Some(3),
            duration_s: None,
            warmup: 1,
            host: "h".into(),
            machine: serde_json::from_str(&dataplane::machine::facts(vec![]).to_json()).ok(),
            unix_time: 0,
            command: vec![],
            lat: vec![
                rec.summary("lat", 2).unwrap(),
                rec.summary("lat", 4).unwrap(),
            ],
            under_load: None,
            bw: vec![],
        }
    }

    #[test]
    fn table_csv_and_svg_carry_every_size() {
        let r = report();
        let t = table(&r);
        for c in LAT_COLUMNS {
            assert!(t.contains(c), "{c} missing from\n{t}");
        }
        // The machine's facts: a line of the table, an object in the JSON.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(t.contains(" cores, kernel ") && t.contains(&format!("{cores} cores")), "{t}");
        assert_eq!(r.machine.as_ref().and_then(|m| m.get("cores")).and_then(|c| c.as_u64()), Some(cores as u64));
        let c = csv(&r);
        assert_eq!(c.lines().count(), 3, "{c}");
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .starts_with("tcp,send,none,2,3,1.000,3.000,"),
            "{c}"
        );
        let svg = sweep_svg("t", std::slice::from_ref(&r));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&lt;b") && !svg.contains("a<b"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        // JSON round trip.
        let back: PerfReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn bandwidth_rows_in_perftests_units() {
        let b = BwStats {
            bytes: 1 << 20,
            ops: 100,
            elapsed_ns: 1_000_000_000,
            peak_bytes_per_s: 200.0 * f64::from(1u32 << 20),
        };
        let row = BwRow::from(&b);
        assert_eq!(row.bw_avg_mb_s, 100.0);
        assert_eq!(row.bw_peak_mb_s, 200.0);
        assert!((row.msg_rate_mpps - 1e-4).abs() < 1e-12);
        let mut s = String::new();
        bw_rows(&mut s, &[row]);
        assert!(s.contains("BW peak[MB/sec]") && s.contains("100.00") && s.contains("0.000100"));
    }
}
