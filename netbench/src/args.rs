//! netbench's command line: the subcommands, their flags, and the size
//! parser behind `--size`/`--max-region`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::client::ReaderIdle;
use crate::fail::{Fail, Res};
use crate::perf::Verb;
use crate::server::Idle;
use crate::transport::TransportKind;

#[derive(Parser)]
#[command(
    name = "netbench",
    version,
    about = "Incast one-sided READ tail-latency benchmark (rdma, tcp, tcp-blocking, shm) and \
             calibration of the scheduler's network delay bound"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
    /// perftest's latency test (ib_{read,write,send}_lat) over any transport.
    #[command(after_long_help = crate::perf_out::VERB_HELP)]
    Lat(PerfArgs),
    /// perftest's bandwidth test (ib_{read,write,send}_bw) over any transport.
    #[command(after_long_help = crate::perf_out::VERB_HELP)]
    Bw(PerfArgs),
    /// Draw latency and bandwidth against size from saved `lat`/`bw` runs
    /// (JSON), one line per verb and transport, as SVG.
    SweepPlot(SweepPlotArgs),
}

/// Why a size argument was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SizeError {
    #[error("{value:?} is not a size (e.g. 153600, 150KiB, 1MiB)")]
    NotASize { value: String },
    #[error("unknown size unit {unit:?} in {value:?}")]
    Unit { unit: String, value: String },
    #[error("{value:?} is too large")]
    TooLarge { value: String },
    #[error("{value:?}: object sizes go up to 4 GiB - 1")]
    ObjectTooLarge { value: String },
}

/// Bytes: a number with an optional suffix (K/KiB = 1024, M/MiB = 1024^2,
/// KB = 1000, MB = 1000^2).
fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| SizeError::NotASize { value: s.to_string() })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => return Err(SizeError::Unit { unit: other.to_string(), value: s.to_string() }),
    };
    n.checked_mul(mult).ok_or_else(|| SizeError::TooLarge { value: s.to_string() })
}

fn parse_object_size(s: &str) -> Result<u32, SizeError> {
    let v = parse_size(s)?;
    u32::try_from(v).map_err(|_| SizeError::ObjectTooLarge { value: s.to_string() })
}

#[derive(Args, Clone)]
pub(crate) struct Shape {
    /// Objects per server.
    #[arg(long, short = 'k', default_value_t = 8)]
    pub(crate) objects: u32,
    /// Bytes per object (suffixes: KiB, MiB, KB, MB).
    #[arg(long, short = 's', default_value = "150KiB", value_parser = parse_object_size)]
    pub(crate) size: u32,
    /// Largest registered region (server objects, reader landing buffers).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub(crate) max_region: u64,
    #[command(flatten)]
    pub(crate) rdma: node_shell::RdmaArgs,
}

impl Shape {
    /// Checks the shape against the protocol and `kind`'s longest READ, before any
    /// transport is opened (the commands that start servers themselves).
    pub(crate) fn check(&self, kind: TransportKind) -> crate::fail::Res<()> {
        crate::server::check_shape(self.objects, self.size, crate::max_read_for(kind), self.max_region, kind)
    }
}

#[derive(Args, Clone)]
pub(crate) struct Measure {
    /// Measured rounds.
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub(crate) iters: u64,
    /// Unmeasured rounds first [default: iters/10, 1..=1000].
    #[arg(long)]
    pub(crate) warmup: Option<u64>,
    /// READs outstanding per peer [default: all of a round's at once].
    #[arg(long)]
    pub(crate) concurrency: Option<usize>,
    /// Control message size in bytes on the wire: 32 (Heartbeat) or 112..=32768 (a Completion
    /// with inline bytes; 112 = header + completion head, wire version 8 and later).
    #[arg(long, default_value_t = 32)]
    pub(crate) ping_size: usize,
    /// Time a control message round trip after every this many rounds (0 = never: servers
    /// that sleep when idle then never wake during a READ-latency run).
    #[arg(long, default_value_t = 1)]
    pub(crate) ping_every: u64,
    /// Check one READ's landed bytes every this many rounds (0 = never).
    #[arg(long, default_value_t = 1)]
    pub(crate) verify_every: u64,
    /// Bound on connecting to a peer and getting its catalog, ms.
    #[arg(long, default_value_t = 5000)]
    pub(crate) connect_timeout_ms: u64,
    /// Bound on one round (and one ping), ms.
    #[arg(long, default_value_t = 10000)]
    pub(crate) round_timeout_ms: u64,
    /// How the reader waits for answers: spin (busy-poll) or block (sleep in the kernel on
    /// the connection, as sockperf's and qperf's clients do; one peer only for READs).
    #[arg(long, value_enum, default_value_t = ReaderIdle::Spin)]
    pub(crate) reader_idle: ReaderIdle,
}

/// The forms of a report: a table (default), JSON or CSV on stdout, and a
/// JSON copy in a file.
#[derive(Args, Clone)]
pub(crate) struct ReportForm {
    /// Print the report as JSON (HdrHistogram V2 base64 histograms; lat/bw: one entry
    /// per size).
    #[arg(long, conflicts_with = "csv")]
    pub(crate) json: bool,
    /// Print CSV instead of the table.
    #[arg(long)]
    pub(crate) csv: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub(crate) save: Option<PathBuf>,
}

impl ReportForm {
    /// Writes `json` to the `--save` file, if one was given.
    pub(crate) fn save(&self, json: &str) -> Res<()> {
        if let Some(p) = &self.save {
            std::fs::write(p, json).map_err(Fail::write(p.clone()))?;
        }
        Ok(())
    }

    /// Prints the chosen form.
    pub(crate) fn print(&self, json: &str, table: impl FnOnce() -> String, csv: impl FnOnce() -> String) {
        if self.json {
            println!("{json}");
        } else if self.csv {
            print!("{}", csv());
        } else {
            print!("{}", table());
        }
    }
}

#[derive(Args, Clone)]
pub(crate) struct Output {
    #[command(flatten)]
    pub(crate) form: ReportForm,
    /// Also draw this run's percentile plot (SVG).
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Name of the run in reports and plots.
    #[arg(long)]
    pub(crate) label: Option<String>,
}

#[derive(Args, Clone)]
pub(crate) struct LocalOpts {
    /// Servers to start on this machine.
    #[arg(long, short = 'p', default_value_t = 8)]
    pub(crate) servers: usize,
    /// Put each server (and the reader) in its own network namespace, joined by veth pairs
    /// and a bridge (tcp transports; needs root and iproute2).
    #[arg(long)]
    pub(crate) netns: bool,
    /// `tc netem` arguments for each server's egress, e.g. "delay 100us 20us loss 0.01%".
    #[arg(long, requires = "netns", conflicts_with = "server_qdisc")]
    pub(crate) netem: Option<String>,
    /// `tc netem` arguments for the switch port towards the reader (where an incast converges).
    #[arg(long, requires = "netns", conflicts_with = "client_qdisc")]
    pub(crate) client_netem: Option<String>,
    /// Any `tc` root qdisc (kind + arguments) for each server's egress, e.g. "tbf rate 1gbit burst 64kb latency 1ms".
    #[arg(long, requires = "netns")]
    pub(crate) server_qdisc: Option<String>,
    /// Any `tc` root qdisc for the switch port towards the reader (the incast bottleneck).
    #[arg(long, requires = "netns")]
    pub(crate) client_qdisc: Option<String>,
    /// How servers wait for work.
    #[arg(long, value_enum, default_value_t = Idle::Block)]
    pub(crate) server_idle: Idle,
    /// Address servers listen on without --netns.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) listen_host: String,
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    pub(crate) transport: TransportKind,
    /// Listen address (tcp/rdma: HOST:PORT, port 0 = any; shm: Unix socket path or @name).
    #[arg(long, short = 'l')]
    pub(crate) listen: Option<String>,
    #[command(flatten)]
    pub(crate) shape: Shape,
    /// Server id (announced in the catalog).
    #[arg(long, default_value_t = 0)]
    pub(crate) id: u32,
    /// How to wait for work.
    #[arg(long = "server-idle", value_enum, default_value_t = Idle::Block)]
    pub(crate) idle: Idle,
    /// Exit when the parent process exits (used by `netbench local`).
    #[arg(long, hide = true)]
    pub(crate) exit_with_parent: bool,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    pub(crate) duration_s: Option<f64>,
    /// Stop once this many clients have connected and left.
    #[arg(long)]
    pub(crate) exit_after_clients: Option<u64>,
    /// rdma: register the objects remote-writable too, for `lat`/`bw --verb write`'s
    /// RDMA WRITEs (other transports emulate WRITE with messages and ignore it).
    #[arg(long)]
    pub(crate) writable: bool,
}

/// What an incast reads and how it is measured (`incast`, `local`, `calibrate`).
#[derive(Args, Clone)]
pub(crate) struct Workload {
    #[command(flatten)]
    pub(crate) shape: Shape,
    #[command(flatten)]
    pub(crate) measure: Measure,
}

#[derive(Args)]
pub(crate) struct IncastArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    pub(crate) transport: TransportKind,
    /// Server addresses, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) peers: Vec<String>,
    #[command(flatten)]
    pub(crate) work: Workload,
    #[command(flatten)]
    pub(crate) output: Output,
    /// Describes the fabric in reports.
    #[arg(long)]
    pub(crate) fabric: Option<String>,
}

#[derive(Args)]
pub(crate) struct LocalArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    pub(crate) transport: TransportKind,
    #[command(flatten)]
    pub(crate) local: LocalOpts,
    #[command(flatten)]
    pub(crate) work: Workload,
    #[command(flatten)]
    pub(crate) output: Output,
}

#[derive(Args)]
pub(crate) struct CalibrateArgs {
    /// Transport.
    #[arg(long, short = 't', value_enum)]
    pub(crate) transport: TransportKind,
    /// Server addresses (default: start --servers local servers).
    #[arg(long, value_delimiter = ',')]
    pub(crate) peers: Vec<String>,
    #[command(flatten)]
    pub(crate) local: LocalOpts,
    #[command(flatten)]
    pub(crate) work: Workload,
    /// Percentile of the bound.
    #[arg(long, default_value_t = 99.99)]
    pub(crate) percentile: f64,
    /// Batch sizes (READs per round) [default: 1, 2, 4, ... up to peers x objects].
    #[arg(long, value_delimiter = ',')]
    pub(crate) batches: Vec<usize>,
    /// Where to write the delay file.
    #[arg(long, short = 'o')]
    pub(crate) out: PathBuf,
    /// Add the fit's intercept (fixed cost of a round) to d_ctrl.
    #[arg(long)]
    pub(crate) fold_intercept: bool,
    /// Describes the fabric in the file.
    #[arg(long)]
    pub(crate) fabric: Option<String>,
    /// Also write each batch size's JSON report into this directory.
    #[arg(long)]
    pub(crate) save_dir: Option<PathBuf>,
    /// From the same measurement, also write files at these percentiles (OUT with `.pNN`
    /// before the extension, e.g. delay.p99.toml).
    #[arg(long, value_delimiter = ',')]
    pub(crate) extra_percentiles: Vec<f64>,
}

#[derive(Args)]
pub(crate) struct PlotArgs {
    /// JSON reports (from --json or --save).
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// Output SVG file.
    #[arg(long, short = 'o')]
    pub(crate) out: PathBuf,
    /// Metrics to draw, one panel each (round, read, ctrl_rtt) [default: all present].
    #[arg(long, value_delimiter = ',')]
    pub(crate) metric: Vec<String>,
    /// Linear latency axis (default: log).
    #[arg(long)]
    pub(crate) linear_y: bool,
    /// Figure title [default: "netbench: latency by percentile"].
    #[arg(long)]
    pub(crate) title: Option<String>,
}

#[derive(Args, Clone)]
pub(crate) struct PerfArgs {
    /// Transport (what WRITE and SEND mean on each: see below).
    #[arg(long, short = 't', value_enum)]
    pub(crate) transport: TransportKind,
    /// The operation measured.
    #[arg(long, value_enum, default_value_t = Verb::Read)]
    pub(crate) verb: Verb,
    /// Every size from 2 B to 8 MiB in powers of two (perftest's -a).
    #[arg(short = 'a', long = "all-sizes", conflicts_with = "size")]
    pub(crate) all_sizes: bool,
    /// Bytes per operation (suffixes: KiB, MiB, KB, MB); netbench's one default size, the
    /// serving input of the incast commands (perftest's lat default is 2 B: `-s 2`).
    #[arg(long, short = 's', default_value = "150KiB", value_parser = parse_object_size)]
    pub(crate) size: u32,
    /// Measured iterations per size: rounds (lat) or operations per queue pair (bw)
    /// [default: 1000 (lat), 5000 (bw), as perftest].
    #[arg(long, short = 'n', conflicts_with = "duration")]
    pub(crate) iters: Option<u64>,
    /// Measure each size for this many seconds instead of -n iterations.
    #[arg(long, short = 'D')]
    pub(crate) duration: Option<f64>,
    /// Unmeasured iterations first, per size [default: iters/10, 1..=100 (lat); tx-depth (bw)].
    #[arg(long)]
    pub(crate) warmup: Option<u64>,
    /// Queue pairs (connections) per server; each round of lat posts one operation on
    /// every queue pair, bw keeps --tx-depth in flight on each.
    #[arg(long = "qp", short = 'q', value_name = "QPS", default_value_t = 1)]
    pub(crate) queue_pairs: usize,
    /// Operations in flight per queue pair (bw). rdma SENDs in flight are also bounded by
    /// the send queue's slots, SYMPHONY_RDMA_SEND_SLOTS (default 64).
    #[arg(long, default_value_t = 128)]
    pub(crate) tx_depth: usize,
    /// READ/WRITE work requests per post call, one doorbell (bw), 1..=16 (perftest's
    /// --post_list, whose default is 1 too).
    #[arg(long, short = 'l', default_value_t = 1)]
    pub(crate) post_list: usize,
    /// rdma: receives each server keeps posted per queue pair for SENDs (perftest's
    /// --rx-depth; a SEND finding none is retried by the NIC, receiver-not-ready): raw SENDs
    /// (netbench built with --features rdma) land in one registered buffer; otherwise each
    /// local server's control ring has this many 32 KiB slots (`netbench serve` takes
    /// SYMPHONY_RDMA_RECV_SLOTS) [default: 512, as perftest; the control ring's 64 unless
    /// bw --verb send].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) rx_depth: Option<u32>,
    /// bw: the server answers every WRITE/SEND with one of the same size and both
    /// directions count (READ: refused).
    #[arg(long, short = 'b')]
    pub(crate) bidirectional: bool,
    /// lat: measure again while another connection per server streams --load-verb
    /// operations of --load-size bytes; reports both sets of percentiles.
    #[arg(long)]
    pub(crate) under_load: bool,
    /// The concurrent stream's operation [default: the measured --verb].
    #[arg(long, value_enum, requires = "under_load")]
    pub(crate) load_verb: Option<Verb>,
    /// The concurrent stream's bytes per operation.
    #[arg(long, default_value = "64KiB", value_parser = parse_object_size, requires = "under_load")]
    pub(crate) load_size: u32,
    /// The concurrent stream's operations in flight.
    #[arg(long, default_value_t = 16, requires = "under_load")]
    pub(crate) load_depth: usize,
    /// Running servers (`netbench serve --objects 1 --size LARGEST`), comma separated;
    /// default: start --servers local ones.
    #[arg(long, value_delimiter = ',')]
    pub(crate) peers: Vec<String>,
    /// Local servers to start: absent, one (point to point, as perftest); more than one,
    /// an incast, every round or stream spanning all (as `netbench local --servers`).
    #[arg(long = "servers", short = 'p', conflicts_with = "peers")]
    pub(crate) servers_given: Option<usize>,
    /// How local servers wait for work [default: spin when every server and the client
    /// have a core, else block].
    #[arg(long, value_enum)]
    pub(crate) server_idle: Option<Idle>,
    /// Address local servers listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) listen_host: String,
    /// RDMA device, e.g. mlx5_0 or rxe0 (perftest's -d; env SYMPHONY_RDMA_DEVICE)
    /// [default: the first device with an active port].
    #[arg(short = 'd', long = "rdma-device", value_name = "NAME")]
    pub(crate) rdma_device: Option<String>,
    /// RDMA port, from 1 (perftest's -i; env SYMPHONY_RDMA_PORT) [default: 1].
    #[arg(short = 'i', long = "rdma-port", value_name = "PORT",
          value_parser = clap::value_parser!(u8).range(1..))]
    pub(crate) rdma_port: Option<u8>,
    /// GID table index (perftest's -x; env SYMPHONY_RDMA_GID_INDEX) [default: RoCE v2
    /// with an IPv4-mapped address, then RoCE v2, then any].
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub(crate) gid_index: Option<u32>,
    /// Bound on connecting to a server and getting its catalog, ms.
    #[arg(long, default_value_t = 5000)]
    pub(crate) connect_timeout_ms: u64,
    /// Longest wait for any progress of an operation, ms.
    #[arg(long, default_value_t = 10000)]
    pub(crate) op_timeout_ms: u64,
    #[command(flatten)]
    pub(crate) form: ReportForm,
    /// Also draw this run against size (SVG): latency (t_typical, p99) or bandwidth.
    #[arg(long)]
    pub(crate) svg: Option<PathBuf>,
    /// Name of the run in reports and plots [default: transport and verb].
    #[arg(long)]
    pub(crate) label: Option<String>,
}

impl PerfArgs {
    /// Local servers to start (absent: one, point to point).
    pub(crate) fn servers(&self) -> usize {
        self.servers_given.unwrap_or(1)
    }

    /// The RDMA selection of -d/-i/-x.
    pub(crate) fn rdma(&self) -> node_shell::RdmaArgs {
        node_shell::RdmaArgs {
            rdma_device: self.rdma_device.clone(),
            rdma_port: self.rdma_port,
            gid_index: self.gid_index,
        }
    }
}

#[derive(Args)]
pub(crate) struct SweepPlotArgs {
    /// JSON reports of `netbench lat`/`bw` (from --json or --save).
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// Output SVG file.
    #[arg(long, short = 'o')]
    pub(crate) out: PathBuf,
    /// Figure title [default: "netbench: latency and bandwidth by size"].
    #[arg(long)]
    pub(crate) title: Option<String>,
}
