//! `symphony`: the operator CLI: simulate, search goodput, replay the
//! paper's worked example, and produce the reports in docs/benchmarks.md.

mod bench;
mod bench_cluster;
mod chaos_cmd;
mod cli;
mod example;
mod plot;
mod predict;
mod profile;
mod progress;
mod report_ablation;
mod report_grid;
mod serf_measure;
mod reports;
mod report_fig15;
mod live;
mod partition_cmd;
mod route_cmd;
mod up;
mod up_autoscale;
mod up_ha;

use clap::{Parser, Subcommand};
use cli::{ClusterArgs, CliError};
use progress::Progress;
use scheduler::goodput::{search, GoodputError, GoodputSearch};
use scheduler::policy::{build, PolicyError};
use scheduler::sim::{simulate, InvariantViolation, SimReport};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Why a command failed; `main` prints it after "symphony: " and exits 2.
#[derive(Debug, thiserror::Error)]
enum CommandError {
    #[error(transparent)]
    Cli(#[from] CliError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Goodput(#[from] GoodputError),
    #[error(transparent)]
    Simulation(#[from] InvariantViolation),
    #[error(transparent)]
    Plot(#[from] plot::WriteError),
    #[error("cannot encode the report: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Example(#[from] example::ExampleError),
    #[error(transparent)]
    Live(#[from] live::LiveError),
    #[error(transparent)]
    Profile(#[from] profile::ProfileCmdError),
    #[error(transparent)]
    Report(#[from] reports::ReportError),
    #[error(transparent)]
    Chaos(#[from] chaos_cmd::ChaosCmdError),
    #[error(transparent)]
    Bench(#[from] bench::BenchError),
    #[error(transparent)]
    Partition(#[from] partition_cmd::PartitionCmdError),
    #[error(transparent)]
    Route(#[from] route_cmd::RouteCmdError),
    #[error(transparent)]
    Predict(#[from] predict::PredictError),
    #[error(transparent)]
    Grid(#[from] report_grid::GridError),
    #[error(transparent)]
    BenchCluster(#[from] bench_cluster::BenchClusterError),
    #[error(transparent)]
    Autoscale(#[from] tools::autoscale::kubernetes::AutoscaleCmdError),
    /// `up` and `e2e`.
    #[error(transparent)]
    Up(#[from] up::UpError),
}

#[derive(Parser)]
#[command(name = "symphony", version, about = "Deferred batch scheduling for cluster DNN serving")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a local multi-process cluster (scheduler, frontends, emulated-GPU backends), drive a zoo workload over HTTP, print a summary.
    Up {
        /// The cluster's models of the zoo: all, strong, weak, none, or NAME,NAME,...
        #[arg(long, default_value = "all")]
        models: String,
        #[command(flatten)]
        cluster: up::ClusterOpts,
        /// Offered load as a fraction of the simulated (scheduler-only) goodput.
        #[arg(long, default_value_t = 0.8)]
        load: f64,
        /// Offered load in requests per second (overrides --load).
        #[arg(long)]
        rate: Option<f64>,
        /// Seconds of load.
        #[arg(long = "duration-s", default_value_t = 10.0)]
        duration_s: f64,
        /// Keep the cluster running for outside clients (prints the HTTP addresses) until Ctrl-C.
        #[arg(long)]
        serve: bool,
        /// Write SVG figures into this directory (default: ./symphony-up).
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ha: up_ha::HaOpts,
        #[command(flatten)]
        autoscale: up_autoscale::AutoscaleOpts,
        /// Several active schedulers (issue 19): 2 scheduler groups on a local etcd, one backend each, one
        /// frontend following the routing table and linked to both; the last model of --models moves to
        /// group b at --reroute-at-s (tcp; --rate or 100 req/s). Prints how soon group a applied the move,
        /// the resubmissions and the accounting.
        #[arg(long, default_value_t = 0)]
        groups: u32,
        /// With --groups: when the last model moves, seconds into the load.
        #[arg(long = "reroute-at-s", default_value_t = 1.0)]
        reroute_at_s: f64,
        /// With --groups: a standby scheduler per group (same election key), both in the table.
        #[arg(long = "group-standby")]
        group_standby: bool,
        /// With --groups --group-standby: kill group a's leader (SIGKILL) this many seconds into the load.
        #[arg(long = "kill-a-leader-at-s")]
        kill_a_leader_at_s: Option<f64>,
        /// With --groups: group b is not in the table until the move (its schedulers run from the start);
        /// the move adds it, and the frontend links to it without a restart.
        #[arg(long = "group-b-added")]
        group_b_added: bool,
    },
    /// End-to-end goodput of the multi-process cluster over HTTP vs the simulated scheduler-only goodput.
    E2e {
        /// The cluster's models of the zoo: all, strong, weak, none, or NAME,NAME,...
        #[arg(long, default_value = "all")]
        models: String,
        #[command(flatten)]
        cluster: up::ClusterOpts,
        /// Seconds per load run.
        #[arg(long = "run-s", default_value_t = 6.0)]
        run_s: f64,
        /// Bisection steps.
        #[arg(long, default_value_t = 6)]
        steps: u32,
        /// Trials per rate (each on a fresh cluster); a rate passes when most do.
        #[arg(long, default_value_t = 3)]
        trials: u32,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The in-process live scheduler runtime with emulated GPUs next to the simulator (scheduler-only capacity).
    Live {
        /// Model zoo: a100 or 1080ti.
        #[arg(long, default_value = "a100")]
        zoo: String,
        /// Models of the zoo: all, strong, weak, or NAME,NAME,... (`--zoo-models`: the old spelling, kept hidden for one release).
        #[arg(long = "models", alias = "zoo-models", default_value = "all")]
        zoo_models: String,
        /// Emulated GPUs.
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        /// Offered load as a fraction of the simulated goodput.
        #[arg(long, default_value_t = 0.8)]
        load: f64,
        /// Seconds of load.
        #[arg(long = "duration-s", default_value_t = 10.0)]
        duration_s: f64,
        /// ModelThreads.
        #[arg(long = "model-threads", default_value_t = 1)]
        model_threads: usize,
        /// Idle strategy: park (shares the machine), yield, spin (pinned, for dedicated cores).
        #[arg(long, default_value = "park")]
        idle: String,
        /// Write SVG figures into this directory.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Simulate one offered load.
    Sim {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Total offered rate, requests per second.
        #[arg(long, allow_negative_numbers = true)]
        rate: f64,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Write SVG figures (batch-size distribution) into this directory.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Find the highest rate at which every model's bad rate stays <= 1%.
    Goodput {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Write SVG figures (batch sizes at goodput; goodput and GPU use vs offered load) into this directory.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
        /// Run each probe until it has measured at least this many requests
        /// of every model, times the gaps' squared CV when above 1 (5x
        /// under gamma:0.2): a low rate runs longer, up to 10000 times; 0:
        /// --duration-s always.
        #[arg(long, default_value_t = 0)]
        min_requests: u64,
        /// Start from this rate (rps) and bracket the goodput around it,
        /// widening by 2% and doubling per probe, instead of from the
        /// cluster's ceiling: what `report grid` does for every seed after
        /// the first, from the first seed's goodput.
        #[arg(long)]
        warm_from: Option<f64>,
    },
    /// Replay the paper's worked example (3 GPUs, l(b)=b+5, SLO 12).
    Example {
        /// Policy to replay.
        #[arg(long, default_value = "deferred")]
        policy: String,
        /// Request numbers (1-based) to leave out, e.g. 13,14,15.
        #[arg(long, value_delimiter = ',')]
        skip: Vec<u32>,
        /// How many requests arrive.
        #[arg(long, default_value_t = 48)]
        requests: u32,
        /// Batch gathering of the replay: lazy (the paper's example) or early; `sim`'s --gather defaults to early.
        #[arg(long = "replay-gather", default_value = "lazy")]
        gather: String,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// SERF's M/D/c-with-interference prediction: mean latency per concurrent batches per worker, and the best.
    Predict(predict::PredictArgs),
    /// Measure the latency profile l(b) = alpha*b + beta of real ONNX models in a Triton-layout repository; writes REPO/profile.json.
    Profile(profile::ProfileArgs),
    /// Partition models over sub-clusters (the arXiv paper's Appendix A): memory fits, rate and memory balanced, at most C_max moved.
    Partition(partition_cmd::PartitionArgs),
    /// The routing table of several active scheduler groups in etcd: show it, store one, move models.
    Route {
        #[command(subcommand)]
        action: route_cmd::RouteAction,
    },
    /// Scheduler-only capacity test: the live runtime with in-process load and emulated GPUs.
    BenchScheduler {
        /// Models: this many copies of --profile.
        #[arg(long = "profile-copies", default_value_t = 20)]
        models: usize,
        /// Emulated GPUs (required: a capacity test states its size; the figures use 1000).
        #[arg(long)]
        gpus: u32,
        /// ModelThreads.
        #[arg(long = "model-threads", default_value_t = 1)]
        model_threads: usize,
        /// Offered rate, requests/s (required unless --find-max).
        #[arg(long, required_unless_present = "find_max")]
        rate: Option<f64>,
        /// Instead of --rate: search for the highest rate with dispatch lag p99.9 <= 100 us and bad rate <= 1%.
        #[arg(long = "find-max")]
        find_max: bool,
        /// Seconds per run.
        #[arg(long = "duration-s", default_value_t = 10.0)]
        duration_s: f64,
        /// Model profile as ALPHA_MS,BETA_MS,SLO_MS (default: an A100-class ResNet-like model, so 1,000 GPUs absorb several million requests/s and the scheduler is what is measured).
        #[arg(long, default_value = "0.1,5,50")]
        profile: String,
        /// Idle strategy of the runtime's threads: park (shares the machine), yield, spin (pinned, for dedicated cores; what the capacity figures use).
        #[arg(long, default_value = "park")]
        idle: String,
        /// Do not pin threads to cores.
        #[arg(long = "no-pin")]
        no_pin: bool,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// What the scheduler daemon ingests through the real wire protocol: the daemon plus synthetic frontend and backend processes.
    BenchCluster(bench_cluster::BenchClusterArgs),
    /// The autoscale controller of a cluster on Kubernetes: scales the backend StatefulSet on the scheduler's signals (runs in a pod: deploy/overlays/autoscale).
    Autoscale(tools::autoscale::kubernetes::AutoscaleArgs),
    /// Deterministic cluster run with seeded fault injection: the real scheduler, frontend and backend nodes on virtual time over an in-memory network; checks that every request ends exactly once.
    Chaos {
        /// Seed of the workload and of every fault (the same seed replays the same trace).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Fault classes: all, none, failover, or a list of loss,dup,reorder,partition,crash,slow-gpu,stall,
        /// the failover classes leader-crash,leader-pause,store-down,leader-partition (three schedulers),
        /// reroute,reroute2 (two scheduler groups) and the membership classes drain,join (none of these in `all`).
        #[arg(long, default_value = "all")]
        faults: String,
        /// Seconds of arrivals (virtual time).
        #[arg(long, default_value_t = 10.0)]
        duration_s: f64,
        /// Frontend nodes (as `up`'s; the CI sweeps use 3, printed in each replay line).
        #[arg(long, default_value_t = 2)]
        frontends: usize,
        /// Backend nodes, one emulated GPU each (as `up`'s; the CI sweeps use 4).
        #[arg(long, default_value_t = 2)]
        backends: usize,
        /// Offered load, requests per second (the default: about half of two GPUs' capacity for the two models).
        #[arg(long, default_value_t = 400.0)]
        rate: f64,
        /// Run this many seeds (seed, seed+1, ...) and print a summary.
        #[arg(long = "seed-count")]
        seeds: Option<u64>,
        /// Threads for --seed-count (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Share of requests at priority 1 (the rest at 2; 0 = no priorities).
        #[arg(long = "priority-mix", default_value_t = 0.0)]
        priority_mix: f64,
        /// Share of requests the client cancels at a random point of their budget.
        #[arg(long = "cancel-share", default_value_t = 0.0)]
        cancel_share: f64,
        /// Every model's queue bound at the scheduler (0 = unbounded).
        #[arg(long = "max-queue", default_value_t = 0)]
        max_queue: u32,
        /// List every message of this task (hex id, as a violation names it) the network carried.
        #[arg(long = "trace-task")]
        trace_task: Option<String>,
        /// Switch on a deliberate bug (builds with the `mutations` feature only).
        #[arg(long)]
        mutation: Option<String>,
        /// Print JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Reproduce a figure or table of docs/benchmarks.md (Markdown on stdout).
    Report {
        /// table2, fig6a, fig6b, fig7, fig9, fig2, fig10, fig11, fig12, grid, ablation, fig13, fig14, fig15, live-curve, fig16.
        name: String,
        /// Fewer and shorter runs (for a quick look; the docs use the default).
        #[arg(long)]
        quick: bool,
        /// Write SVG figures into this directory where the report has any.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print JSON on stdout (grid, ablation, fig13, fig15).
        #[arg(long)]
        json: bool,
        /// fig13: the ModelThread counts, N,N,... (default 1 up to the machine's cores, at least 2).
        #[arg(long = "model-thread-counts", value_delimiter = ',')]
        model_threads: Vec<usize>,
        /// grid: the seeds each goodput is the median over (default 1,2,3,4,5; --quick or --sample: 1). fig15: the day's seed (its shares, arrivals and goodput search; default 1).
        #[arg(long, value_delimiter = ',')]
        seeds: Vec<u64>,
        /// grid, ablation: compare on this many workloads drawn at random from a stated space instead of the fixed grid (ablation: besides it; default 8 with --quick, else 40).
        #[arg(long)]
        sample: Option<usize>,
        /// grid, ablation: the seed the --sample workloads are drawn with.
        #[arg(long = "sample-seed", default_value_t = 1)]
        sample_seed: u64,
        /// grid: deferred with these departures from Algorithm 1 off (names as `report ablation` prints them, comma-separated).
        #[arg(long = "departures-off", default_value = "")]
        departures_off: String,
        /// fig15: the policies run under the same autoscaler, comma-separated (default deferred,eager,clockwork).
        #[arg(long = "policy", value_delimiter = ',')]
        policies: Vec<String>,
    },
    /// Run one daemon in this process, as `symphony up` starts its children: `symphony daemon scheduler|frontend|backend [OPTIONS]` is `symphony-scheduler`, `symphony-frontend` or `symphony-backend` with the same options (`symphony daemon ROLE --help`; listed in docs/cli.md).
    #[command(disable_help_flag = true)]
    Daemon {
        /// The role (scheduler, frontend, backend), then its options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "ROLE [OPTIONS]")]
        args: Vec<String>,
    },
    /// docs/cli.md (`symphony docs cli > docs/cli.md`), or every flag's kind and default as JSON (`flags`, for the vocabulary test).
    #[command(hide = true)]
    Docs {
        /// cli or flags.
        #[arg(value_parser = ["cli", "flags"])]
        what: String,
    },
}

/// Every command line this project ships, as docs/cli.md lists them: the
/// `symphony` CLI, the three daemons (also `symphony daemon ROLE`) and
/// netbench.
fn all_commands() -> Vec<clap::Command> {
    use clap::CommandFactory;
    vec![
        Cli::command(),
        scheduler::daemon::SchedulerArgs::command(),
        frontend::daemon::FrontendArgs::command(),
        backend::daemon::BackendArgs::command(),
        netbench::command(),
    ]
}

/// `symphony docs cli|flags`.
fn docs(what: &str) -> Result<(), CommandError> {
    let commands = all_commands();
    if what == "cli" {
        print!("{}", tools::cli_doc::markdown(&commands));
    } else {
        println!("{}", serde_json::to_string_pretty(&tools::cli_doc::flag_uses(&commands))?);
    }
    Ok(())
}

/// `symphony daemon <role> ARGS...` runs one daemon in this process (what
/// `symphony up` starts as its children): the same entry points as the
/// `symphony-scheduler` / `symphony-frontend` / `symphony-backend` binaries.
fn run_daemon(args: &[String]) -> ExitCode {
    let role = args.first().map(String::as_str).unwrap_or("");
    let argv = |name: &str| {
        std::iter::once(name.to_string())
            .chain(args.iter().skip(1).cloned())
            .collect::<Vec<String>>()
    };
    match role {
        "-h" | "--help" | "help" => {
            println!(
                "Runs one daemon in this process (what `symphony up` starts as its children).\n\n\
                 Usage: symphony daemon <ROLE> [OPTIONS]\n\n\
                 Roles:\n  scheduler  the centralized scheduler (same as symphony-scheduler)\n  \
                 frontend   the KServe v2 frontend (same as symphony-frontend)\n  \
                 backend    a GPU backend (same as symphony-backend)\n\n\
                 `symphony daemon <ROLE> --help` lists the role's options."
            );
            ExitCode::SUCCESS
        }
        "scheduler" => scheduler::daemon::main_with_args(argv("symphony-scheduler")),
        "frontend" => frontend::daemon::main_with_args(argv("symphony-frontend")),
        "backend" => backend::daemon::main_with_args(argv("symphony-backend")),
        role @ ("bench-frontends" | "bench-backends") => bench_cluster::peer_main(role, argv(role)),
        _ => {
            eprintln!("symphony daemon: unknown role '{role}' (scheduler, frontend, backend)");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("daemon") {
        return run_daemon(&args[2..]);
    }
    let cli = Cli::parse();
    if let Cmd::Daemon { args } = &cli.cmd {
        return run_daemon(args);
    }
    if matches!(cli.cmd, Cmd::Sim { .. } | Cmd::Goodput { .. } | Cmd::Example { .. } | Cmd::Predict(_) | Cmd::Partition(_) | Cmd::Docs { .. }) || matches!(&cli.cmd, Cmd::Report { name, .. } if name == "grid" || name == "ablation" || name == "fig15") {
        restore_sigpipe();
    }
    node_shell::logging::init_cli();
    match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("symphony: {e}");
            ExitCode::from(2)
        }
    }
}

/// The offline reports (no sockets) end quietly when their reader goes
/// away (`symphony goodput ... | head -1`), as other Unix tools do, instead
/// of panicking in `println!` on a broken pipe. Rust starts with SIGPIPE
/// ignored, which the daemons and the networked commands keep (a peer that
/// closes its socket must not kill them); of the reports only the grid is
/// included, as others may run live clusters.
fn restore_sigpipe() {
    // SAFETY: called once at start, before any thread exists; SIG_DFL is a
    // valid disposition for SIGPIPE and no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cmd: Cmd) -> Result<(), CommandError> {
    match cmd {
        Cmd::Sim { cluster, rate, json, plot } => sim(&cluster, rate, json, plot.as_deref()),
        Cmd::Goodput { cluster, json, plot, quiet, min_requests, warm_from } => goodput(&cluster, json, plot.as_deref(), quiet, min_requests, warm_from),
        Cmd::Example { policy, skip, requests, gather, json } => Ok(example::run(&policy, &skip, requests, &gather, json)?),
        Cmd::Up { models, cluster, rate, duration_s, serve, json, groups, reroute_at_s, group_standby, kill_a_leader_at_s, group_b_added, .. } if groups > 0 => {
            if groups != 2 || serve {
                return Err(CommandError::Up(up::UpError::Usage("--groups runs 2 groups and a move under load: --groups 2, no --serve".into())));
            }
            if kill_a_leader_at_s.is_some_and(|k| !group_standby || k <= reroute_at_s) {
                return Err(CommandError::Up(up::UpError::Usage("--kill-a-leader-at-s wants --group-standby and a time after --reroute-at-s".into())));
            }
            let exe = std::env::current_exe().map_err(|e| CommandError::Up(up::UpError::OwnExe(e)))?;
            let r = tools::groups::run(&tools::groups::GroupsRun {
                exe,
                zoo: cluster.zoo.clone(),
                models,
                rate: rate.unwrap_or(100.0),
                duration_s,
                reroute_at_s,
                seed: 1,
                log_dir: None,
                standby: group_standby,
                kill_a_leader_at_s,
                b_added_at_move: group_b_added,
            })
            .map_err(|e| CommandError::Up(up::run_err(e)))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("moved {} from group a to group b at {reroute_at_s} s: group a applied it after {:.1} ms", r.moved_model, r.applied_after_ms);
                println!("group a's batches of {}: {} when it applied the move, {} at the end; {} tasks answered moved", r.moved_model, r.moved_batches_at_apply, r.moved_batches_at_end, r.moved_drops);
                println!("frontend resubmitted {} tasks answered moved to the new owner (group b ran {} batches of {}); {} requests still ended dropped moved", r.resubmitted, r.moved_batches_b, r.moved_model, r.moved_dropped);
                println!("frontend accepted {} succeeded {} dropped {} failed {}: unaccounted {}", r.frontend[0], r.frontend[1], r.frontend[2], r.frontend[3], r.unaccounted);
                if let Some(t) = &r.takeover {
                    println!("group a's leader (epoch {}) killed: its standby led after {:.0} ms (epoch {}), at revision {}; it planned {} batches of {} and {} of the group's other models", t.old_epoch, t.leads_after_ms, t.new_epoch, t.revision, t.moved_batches, r.moved_model, t.kept_batches);
                }
                println!("load: {}", r.load);
            }
            Ok(())
        }
        Cmd::Up { models, cluster, load, rate, duration_s, serve, plot: _, json, ha, .. } if ha.ha => {
            if serve {
                return Err(CommandError::Up(up::UpError::Usage("--ha runs a failover under load: no --serve".into())));
            }
            up_ha::run(&models, &cluster, &ha, load, rate, duration_s, json).map_err(CommandError::Up)
        }
        Cmd::Up { models, cluster, rate, duration_s, serve, json, autoscale, .. } if autoscale.autoscale => {
            if serve {
                return Err(CommandError::Up(up::UpError::Usage("--autoscale runs a scheduled load: no --serve".into())));
            }
            up_autoscale::run(&models, &cluster, &autoscale, rate, duration_s, json).map_err(CommandError::Up)
        }
        Cmd::Up { models, cluster, load, rate, duration_s, serve, plot, json, .. } => {
            up::run(&up::UpArgs { models, cluster, load, rate, duration_s, serve, plot, json }).map_err(CommandError::Up)
        }
        Cmd::E2e { models, cluster, run_s, steps, trials, json } => {
            up::e2e(&up::E2eArgs { models, cluster, run_s, steps, trials, json }).map_err(CommandError::Up)
        }
        Cmd::Live { zoo, zoo_models, gpus, load, duration_s, model_threads, idle, plot, json } => {
            Ok(live::run(&live::LiveArgs { zoo, zoo_models, gpus, load, duration_s, model_threads, idle, plot, json })?)
        }
        Cmd::Profile(a) => Ok(profile::run(&a)?),
        Cmd::Partition(a) => Ok(partition_cmd::run(&a)?),
        Cmd::Route { action } => Ok(route_cmd::run(&action)?),
        Cmd::Predict(a) => Ok(predict::run(&a)?),
        Cmd::Report { name, quick, json, seeds, sample, sample_seed, departures_off, .. } if name == "grid" => {
            let off = cli::departures_off(&departures_off)?;
            Ok(report_grid::run(quick, json, &seeds, sample.map(|size| report_grid::Sample { size, seed: sample_seed }), off)?)
        }
        Cmd::Report { name, quick, json, sample, sample_seed, .. } if name == "ablation" => {
            Ok(report_ablation::run(quick, json, sample.map(|size| report_grid::Sample { size, seed: sample_seed }))?)
        }
        Cmd::Report { name, quick, plot, json, policies, seeds, .. } if name == "fig15" => Ok(report_fig15::run(quick, plot.as_deref(), json, &policies, seeds.first().copied())?),
        Cmd::Report { name, quick, plot, json, model_threads, .. } if name == "fig13" => Ok(reports::fig13(quick, json, &model_threads, plot.as_deref())?),
        Cmd::Report { name, quick, plot, model_threads, .. } => Ok(reports::run(&name, quick, plot.as_deref(), &model_threads)?),
        Cmd::Chaos { seed, faults, duration_s, frontends, backends, rate, seeds, threads, mutation, json, priority_mix, cancel_share, max_queue, trace_task } => {
            Ok(chaos_cmd::run(&chaos_cmd::ChaosArgs { seed, faults, duration_s, frontends, backends, rate, seeds, threads, mutation, json, priority_mix, cancel_share, max_queue, trace_task })?)
        }
        Cmd::BenchCluster(a) => Ok(bench_cluster::run(&a)?),
        Cmd::Autoscale(a) => Ok(tools::autoscale::kubernetes::run(&a)?),
        // `main` runs the daemon before parsing; here only for completeness.
        Cmd::Daemon { args } => match run_daemon(&args) {
            c if c == ExitCode::SUCCESS => Ok(()),
            _ => Err(CommandError::Up(up::UpError::Usage("the daemon failed".into()))),
        },
        Cmd::Docs { what } => docs(&what),
        Cmd::BenchScheduler { models, gpus, model_threads, rate, find_max, duration_s, profile, idle, no_pin, seed, json } => {
            let rate = match (find_max, rate) {
                (false, Some(r)) => r.to_string(),
                _ => "max".to_string(),
            };
            Ok(bench::run(&bench::BenchArgs { models, gpus, model_threads, rate, duration_s, profile, idle, pin: !no_pin, seed, json })?)
        }
    }
}

/// `symphony sim`: one simulated run.
fn sim(cluster: &ClusterArgs, rate: f64, json: bool, plot: Option<&Path>) -> Result<(), CommandError> {
    let cfg = cluster.sim(rate)?;
    let policy = cluster.policy()?;
    let mut sched = build(&cfg.models, cfg.gpus, &policy)?;
    let report = simulate(&cfg, sched.as_mut())?;
    if let Some(dir) = plot {
        write_batch_plot(dir, &report)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&report);
    }
    Ok(())
}

/// `symphony goodput`: the goodput search, optionally with a load sweep's
/// figures.
fn goodput(cluster: &ClusterArgs, json: bool, plot: Option<&Path>, quiet: bool, min_requests: u64, warm_from: Option<f64>) -> Result<(), CommandError> {
    let cfg = cluster.sim(0.0)?;
    let policy = cluster.policy()?;
    let bar = Progress::new("goodput", quiet);
    let (initial_rps, warm_step) = match warm_from {
        Some(r) if r > 0.0 && r.is_finite() => (r, report_grid::WARM_STEP),
        _ => (0.0, 0.0),
    };
    let knobs = GoodputSearch { min_requests_per_model: min_requests, initial_rps, warm_step, ..GoodputSearch::default() };
    let result = search(&cfg, &policy, &knobs, &mut |i, n, rate, ok| {
        bar.update(i, n, &format!("{rate:.0} rps {}", if ok { "ok" } else { "bad" }))
    })?;
    bar.finish();
    let mut sweep = Vec::new();
    if let Some(dir) = plot {
        if let Some(at) = &result.at_goodput {
            write_batch_plot(dir, at)?;
        }
        sweep = load_sweep(cluster, result.goodput_rps, &bar)?;
        write_sweep_plots(dir, &policy.kind.to_string(), &sweep)?;
    }
    if json {
        let mut v = serde_json::json!({
            "policy": policy.kind.as_str(),
            "gpus": cfg.gpus,
            "goodput_rps": result.goodput_rps,
            "probes": result.probes,
        });
        if let Some(at) = &result.at_goodput {
            v["bad_rate"] = at.bad_rate.into();
            v["median_batch"] = at.median_batch.into();
            v["gpu_idle_fraction"] = at.gpu_idle_fraction.into();
            v["at_goodput"] = serde_json::to_value(at)?;
            v["models"] = v["at_goodput"]["models"].clone();
        }
        if !sweep.is_empty() {
            v["sweep"] = serde_json::to_value(&sweep)?;
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("policy {}  gpus {}  goodput {:.0} rps", policy.kind, cfg.gpus, result.goodput_rps);
        if let Some(at) = &result.at_goodput {
            print_summary(at);
        }
    }
    Ok(())
}

/// One point of an offered-load sweep.
#[derive(serde::Serialize)]
pub struct SweepPoint {
    offered_rps: f64,
    good_rps: f64,
    bad_rate: f64,
    gpu_utilisation: f64,
    median_batch: u32,
}

fn load_sweep(cluster: &ClusterArgs, goodput: f64, bar: &Progress) -> Result<Vec<SweepPoint>, CommandError> {
    let policy = cluster.policy()?;
    let steps = 15;
    let mut out = Vec::new();
    for i in 1..=steps {
        let rate = goodput * 1.5 * f64::from(i) / f64::from(steps);
        bar.update(i, steps, &format!("sweep {rate:.0} rps"));
        let cfg = cluster.sim(rate)?;
        let mut sched = build(&cfg.models, cfg.gpus, &policy)?;
        let r = simulate(&cfg, sched.as_mut())?;
        out.push(SweepPoint {
            offered_rps: rate,
            good_rps: r.good_rps,
            bad_rate: r.bad_rate,
            gpu_utilisation: 1.0 - r.gpu_idle_fraction,
            median_batch: r.median_batch,
        });
    }
    bar.finish();
    Ok(out)
}

fn write_batch_plot(dir: &Path, r: &SimReport) -> Result<(), plot::WriteError> {
    let title = format!("Batch size distribution ({}, {:.0} rps offered)", r.policy, r.offered_rps);
    plot::write_svg(dir, "batch_sizes.svg", &plot::batch_sizes(&title, &r.batch_size_histogram))
}

fn write_sweep_plots(dir: &Path, policy: &str, sweep: &[SweepPoint]) -> Result<(), plot::WriteError> {
    let good = plot::Series { label: policy.to_string(), points: sweep.iter().map(|p| (p.offered_rps, p.good_rps)).collect() };
    let ideal = plot::Series { label: "offered".into(), points: sweep.iter().map(|p| (p.offered_rps, p.offered_rps)).collect() };
    plot::write_svg(dir, "goodput_vs_offered.svg", &plot::lines("Goodput vs offered load", "offered (rps)", "good (rps)", &[good, ideal]))?;
    let util = plot::Series { label: policy.to_string(), points: sweep.iter().map(|p| (p.offered_rps, p.gpu_utilisation)).collect() };
    plot::write_svg(dir, "gpu_utilisation_vs_offered.svg", &plot::lines("GPU utilisation vs offered load", "offered (rps)", "busy fraction", &[util]))
}

fn print_summary(r: &SimReport) {
    println!(
        "offered {:.0} rps  good {:.0} rps  bad rate {:.3}%  median batch {}  GPU idle {:.1}%  p99 {:.2} ms",
        r.measured_offered_rps,
        r.good_rps,
        r.bad_rate * 100.0,
        r.median_batch,
        r.gpu_idle_fraction * 100.0,
        r.p99_ms
    );
    println!(
        "autoscaling: add {:.1} GPUs, remove {:.1} GPUs (of {})",
        r.autoscale.add_gpus, r.autoscale.remove_gpus, r.gpus
    );
    if r.models.len() > 1 {
        println!("{:<24} {:>9} {:>9} {:>8} {:>7} {:>8}", "model", "offered", "good", "bad%", "batch", "p99 ms");
        for m in &r.models {
            println!(
                "{:<24} {:>9} {:>9} {:>8.3} {:>7} {:>8.2}",
                m.name,
                m.offered,
                m.good,
                m.bad_rate * 100.0,
                m.median_batch,
                m.p99_ms
            );
        }
    }
    for c in r.classes.iter().flatten() {
        println!(
            "priority {}: offered {}  good {}  bad rate {:.3}%  refused {}  timeouts {}",
            c.priority,
            c.offered,
            c.good,
            c.bad_rate * 100.0,
            c.refused,
            c.timeouts
        );
    }
}
