//! The scheduler daemon's per-task CPU cost, without processes: one
//! `SchedulerNode` as the daemon builds it (`daemon::build_node`, the
//! pinned engine on its own threads, the daemon's idle wait) is polled by
//! this thread as the daemon's host polls it, over in-memory links that
//! replay pre-encoded batched `Tasks` frames (the bench-cluster workload:
//! 64 frontends, 256 backends, 1000 GPUs, 20 models `0.1,5,50`, Poisson
//! arrivals dealt round robin, coalesced 16 tasks or 50 µs per message,
//! seeded) and emulate backends that report each planned batch done at
//! its planned finish.
//!
//! What it reports is thread CPU time (`CLOCK_THREAD_CPUTIME_ID` for the
//! I/O thread, `/proc/self/task/TID/schedstat` for the runtime's threads)
//! per task the node received, so that other processes on the machine
//! change it far less than wall-clock figures: a thread that waits for a
//! core is not charged. The I/O share includes this bench's own feeding of
//! the links (releasing frames, readiness), a few ns per task.
//!
//! ```sh
//! cargo bench -p scheduler --bench node_path -- [--rate 2000000] [--duration-s 1] [--runs 5] [--engine inline]
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use clap::Parser;
use dataplane::stats::median;
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Completion, Connection, Error, ReadOp};
use dataplane::waitset::IdleWait;
use dataplane::wire::{self, BatchDone, Join, Message, RemoteRef, Role, Task, TaskBatcher, TaskId};
use scheduler::daemon::metrics::SchedulerMetrics;
use scheduler::daemon::node::SchedulerNode;
use scheduler::daemon::{build_node, SchedulerArgs};
use scheduler::sim::{Arrivals, Workload};
use scheduler::zoo::parse_model_arg;
use scheduler::types::DropReason;

#[derive(Parser, Debug, Clone)]
#[command(about = "The scheduler daemon's per-task CPU over in-memory links")]
struct Args {
    /// Offered tasks/s.
    #[arg(long, default_value_t = 2_000_000.0)]
    rate: f64,
    /// Seconds of arrivals per run.
    #[arg(long = "duration-s", default_value_t = 1.0)]
    duration_s: f64,
    /// Runs (each a fresh node on the same input); medians are printed.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Frontend links.
    #[arg(long, default_value_t = 64)]
    frontends: u32,
    /// Backend links.
    #[arg(long, default_value_t = 256)]
    backends: u32,
    /// Emulated GPUs, spread over the backends.
    #[arg(long, default_value_t = 1000)]
    gpus: u32,
    /// Models (copies of one profile).
    #[arg(long, default_value_t = 20)]
    models: u32,
    /// Model profile ALPHA_MS,BETA_MS,SLO_MS.
    #[arg(long, default_value = "0.1,5,50")]
    profile: String,
    /// Most tasks per `Tasks` message.
    #[arg(long, default_value_t = 16)]
    coalesce: usize,
    /// Longest a task waits for its message at a frontend, µs.
    #[arg(long = "coalesce-us", default_value_t = 50)]
    coalesce_us: u64,
    /// Seed of the arrivals.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The daemon's idle strategy (as `--idle`).
    #[arg(long, default_value = "wait")]
    idle: String,
    /// Control delay the scheduler charges, µs (bench-cluster's).
    #[arg(long = "control-delay-us", default_value_t = 200)]
    control_delay_us: u32,
    /// Narrowest schedulable window, µs (bench-cluster's).
    #[arg(long = "min-window-us", default_value_t = 1000)]
    min_window_us: u32,
    /// The daemon's `--ingress-bound` (most requests waiting for the
    /// ModelThread; beyond, refused as overloaded).
    #[arg(long = "ingress-bound", default_value_t = scheduler::runtime::INGRESS_BOUND)]
    ingress_bound: usize,
    /// The daemon's `--engine`: `pinned` (ModelThreads of their own) or
    /// `inline` (the cores on the I/O thread: its figure is then the whole
    /// path, and the ModelThread column is 0).
    #[arg(long, default_value = "pinned")]
    engine: String,
    /// Print one JSON line per run besides the table.
    #[arg(long)]
    json: bool,
    /// `cargo bench` passes it.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One pre-encoded `Tasks` message and when its frontend sends it.
struct Frame {
    at_ns: u64,
    link: u32,
    start: usize,
    len: usize,
}

/// Every frame of a run, in sending order.
struct Script {
    bytes: Vec<u8>,
    frames: Vec<Frame>,
    /// Per frontend link, the indices of its frames in order.
    by_link: Vec<Vec<u32>>,
    tasks: u64,
}

impl Script {
    /// The bench-cluster frontends' traffic: arrivals dealt round robin
    /// over the links, each link's tasks sent as one message once
    /// `coalesce` wait or the oldest has waited `coalesce_us`; a task's
    /// budget is its SLO less that wait.
    fn new(a: &Args, slo: Duration) -> Script {
        let links = a.frontends as usize;
        let wait = Duration::from_micros(a.coalesce_us);
        let arrivals = Arrivals::pooled_for_model_count(a.models as usize, &Workload::poisson(a.rate), a.seed, Duration::from_secs_f64(a.duration_s));
        let mut s = Script { bytes: Vec::new(), frames: Vec::new(), by_link: vec![Vec::new(); links], tasks: 0 };
        // Per link: (arrival, model, seq) waiting for their message.
        let mut waiting: Vec<Vec<(Instant, u32, u64)>> = vec![Vec::new(); links];
        let mut seq = vec![0u64; links];
        // (flush deadline, link, the link's message number it belongs to).
        let mut timers: VecDeque<(Instant, usize, u64)> = VecDeque::new();
        let mut sent = vec![0u64; links];
        let mut batcher = TaskBatcher::new(a.coalesce);
        let mut flush = |s: &mut Script, link: usize, at: Instant, waiting: &mut Vec<(Instant, u32, u64)>| {
            for &(t, model, seq) in waiting.iter() {
                let id = link as u32 + 1;
                let task = Task {
                    task_id: TaskId::new(id, seq & dataplane::ids::SEQ_MASK, 0).0,
                    budget_ns: (t + slo).saturating_since(at).as_nanos(),
                    model_id: model,
                    frontend_id: id,
                    input: RemoteRef::default(),
                    priority: 0,
                    flags: 0,
                };
                batcher.push(&task).expect("the batcher holds `coalesce` tasks");
            }
            s.tasks += waiting.len() as u64;
            waiting.clear();
            let msg = batcher.take().expect("a flush has tasks");
            s.by_link[link].push(s.frames.len() as u32);
            s.frames.push(Frame { at_ns: at.as_nanos(), link: link as u32, start: s.bytes.len(), len: msg.len() });
            s.bytes.extend_from_slice(msg);
        };
        let mut next = 0usize;
        for (t, model) in arrivals {
            while let Some(&(due, link, n)) = timers.front() {
                if due > t {
                    break;
                }
                timers.pop_front();
                if sent[link] == n && !waiting[link].is_empty() {
                    flush(&mut s, link, due, &mut waiting[link]);
                    sent[link] += 1;
                }
            }
            let link = next;
            next = (next + 1) % links;
            seq[link] += 1;
            if waiting[link].is_empty() {
                timers.push_back((t + wait, link, sent[link]));
            }
            waiting[link].push((t, model, seq[link]));
            if waiting[link].len() >= a.coalesce {
                flush(&mut s, link, t, &mut waiting[link]);
                sent[link] += 1;
            }
        }
        while let Some((due, link, n)) = timers.pop_front() {
            if sent[link] == n && !waiting[link].is_empty() {
                flush(&mut s, link, due, &mut waiting[link]);
                sent[link] += 1;
            }
        }
        s
    }
}

/// What the links and this thread share (one thread uses it; atomics only
/// because a `Connection` must be `Send`).
struct Board {
    /// The host's `now`, ns.
    now_ns: AtomicU64,
    /// Per frontend link: frames released (sent by the frontend) so far.
    released: Vec<AtomicUsize>,
    /// Per frontend link: frames the node has taken.
    taken: Vec<AtomicUsize>,
    /// Backend reports coming due: (due ns, conn index).
    due: Mutex<BinaryHeap<Reverse<(u64, usize)>>>,
    plans: AtomicU64,
    planned_tasks: AtomicU64,
    /// Plans whose planned start had passed when the node sent them.
    late_plans: AtomicU64,
}

/// A batch a backend reports done at `due`.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Running {
    due: u64,
    start: u64,
    batch_id: u64,
    gpu: u32,
    count: u32,
}

enum Side {
    Frontend { link: usize, script: Arc<Script> },
    Backend { running: BinaryHeap<Reverse<Running>> },
}

/// An in-memory link: a frontend replays its frames as the board releases
/// them; a backend answers each plan with its `BatchDone` at the planned
/// finish. Both answer the challenge with their registration and beat.
struct BenchConn {
    index: usize,
    side: Side,
    board: Arc<Board>,
    hello: VecDeque<Vec<u8>>,
    heartbeat: Vec<u8>,
    next_beat: u64,
}

/// Heartbeat interval of the emulated peers.
const BEAT: u64 = 100_000_000;

impl Connection for BenchConn {
    fn send(&mut self, msg: &[u8]) -> Result<(), Error> {
        let Side::Backend { running } = &mut self.side else { return Ok(()) };
        if let Ok(Message::BatchPlan(head, tasks)) = wire::decode(msg) {
            let now = self.board.now_ns.load(Relaxed);
            let start = now + head.exec_in_ns;
            running.push(Reverse(Running { due: start + head.run_ns, start, batch_id: head.batch_id, gpu: head.gpu_id, count: tasks.len() as u32 }));
            let b = &self.board;
            b.plans.fetch_add(1, Relaxed);
            b.planned_tasks.fetch_add(tasks.len() as u64, Relaxed);
            if head.exec_in_ns == 0 {
                b.late_plans.fetch_add(1, Relaxed);
            }
            if let Ok(mut due) = b.due.lock() {
                due.push(Reverse((start + head.run_ns, self.index)));
            }
        }
        Ok(())
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        let mut give = |bytes: &[u8]| {
            buf[..bytes.len()].copy_from_slice(bytes);
            Ok(Some(bytes.len()))
        };
        if let Some(m) = self.hello.pop_front() {
            return give(&m);
        }
        let now = self.board.now_ns.load(Relaxed);
        if now >= self.next_beat {
            self.next_beat = now + BEAT;
            return give(&self.heartbeat.clone());
        }
        match &mut self.side {
            Side::Frontend { link, script } => {
                let taken = self.board.taken[*link].load(Relaxed);
                if taken >= self.board.released[*link].load(Relaxed) {
                    return Ok(None);
                }
                self.board.taken[*link].store(taken + 1, Relaxed);
                let f = &script.frames[script.by_link[*link][taken] as usize];
                give(&script.bytes[f.start..f.start + f.len])
            }
            Side::Backend { running } => {
                if running.peek().is_none_or(|r| r.0.due > now) {
                    return Ok(None);
                }
                let Some(Reverse(r)) = running.pop() else { return Ok(None) };
                let d = BatchDone {
                    batch_id: r.batch_id,
                    start_ago_ns: now.saturating_sub(r.start),
                    finish_ago_ns: now.saturating_sub(r.due),
                    gpu_id: r.gpu,
                    count: r.count,
                    ..BatchDone::default()
                };
                Ok(Some(wire::encode(buf, &d).map_err(|_| Error::TooLarge)?))
            }
        }
    }

    fn post_read(&mut self, _op: &ReadOp) -> Result<(), Error> {
        Err(Error::QueueFull)
    }

    fn poll_completions(&mut self, _out: &mut [Completion]) -> Result<usize, Error> {
        Ok(0)
    }

    fn progress(&mut self) -> Result<(), Error> {
        Ok(())
    }

    fn outstanding_reads(&self) -> usize {
        0
    }

    fn max_outstanding_reads(&self) -> usize {
        0
    }

    fn is_connected(&self) -> bool {
        true
    }

    /// Never polled: the host loop below tells the node which links have
    /// input (`set_readable`) from the board, as the daemon's does from its
    /// epoll set; a wait fd makes the node trust that.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(-1)
    }

    fn may_hold_input(&self) -> bool {
        false
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Thread ids of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    dir.filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|tid| std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).is_ok_and(|c| c.trim().starts_with(prefix)))
        .collect()
}

/// CPU ns the threads `tids` have run (schedstat's first field).
fn cpu_ns_of(tids: &[String]) -> u64 {
    tids.iter()
        .filter_map(|tid| std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// GPUs of backend `i` of `peers` when `total` are spread evenly.
fn gpus_of(i: u32, peers: u32, total: u32) -> u32 {
    total / peers + u32::from(i < total % peers)
}

#[derive(Clone, Debug, Default, serde::Serialize)]
struct RunReport {
    received: u64,
    planned: u64,
    dropped: Vec<(String, u64)>,
    /// Tasks received during the load window, per second.
    taken_per_s: f64,
    io_ns_per_task: f64,
    model_ns_per_task: f64,
    total_ns_per_task: f64,
    late_plans: u64,
    plans: u64,
    passes: u64,
    sleeps: u64,
    settled: bool,
    wall_s: f64,
}

fn sched_args(a: &Args) -> Vec<String> {
    let mut v: Vec<String> = ["symphony-scheduler", "--open-membership", "--transport", "shm", "--idle", &a.idle, "--zoo", "a100", "--models", "none"]
        .map(String::from)
        .to_vec();
    for i in 0..a.models {
        v.extend(["--model".to_string(), format!("model{i}={}", a.profile)]);
    }
    v.extend(
        ["--max-registering", "4096", "--control-delay-us", &a.control_delay_us.to_string(), "--min-window-us", &a.min_window_us.to_string(), "--engine", &a.engine, "--ingress-bound", &a.ingress_bound.to_string()]
            .map(String::from),
    );
    v
}

fn run_once(a: &Args, script: &Arc<Script>) -> RunReport {
    let sa = SchedulerArgs::try_parse_from(sched_args(a)).expect("scheduler options");
    let common = sa.common.resolve().expect("common options");
    let cfg = sa.resolve(common).expect("scheduler configuration");
    let metrics = Arc::new(SchedulerMetrics::new(&cfg.models));
    let clock = MonotonicClock::new();
    let mut idle = IdleWait::new(cfg.idle).expect("wait set");
    let (mut node, _layout): (SchedulerNode<BenchConn>, _) = build_node(&cfg, &metrics, 0, &clock, Some(idle.notifier())).expect("node");
    let (nf, nb) = (a.frontends as usize, a.backends as usize);
    let board = Arc::new(Board {
        now_ns: AtomicU64::new(clock.now().as_nanos()),
        released: (0..nf).map(|_| AtomicUsize::new(0)).collect(),
        taken: (0..nf).map(|_| AtomicUsize::new(0)).collect(),
        due: Mutex::new(BinaryHeap::new()),
        plans: AtomicU64::new(0),
        planned_tasks: AtomicU64::new(0),
        late_plans: AtomicU64::new(0),
    });
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let now = clock.now();
    for i in 0..nf + nb {
        let (role, id, gpus) = if i < nf { (Role::Frontend, i as u32 + 1, 0) } else { (Role::Backend, (i - nf) as u32 + 1, gpus_of((i - nf) as u32, a.backends, a.gpus)) };
        let mut hello = VecDeque::new();
        let n = wire::encode(&mut buf, &Join::new(role, id, gpus, "bench:none")).expect("join");
        hello.push_back(buf[..n].to_vec());
        if role == Role::Backend {
            let ids: Vec<u32> = (0..a.models).collect();
            let n = wire::encode_models(&mut buf, &ids).expect("models");
            hello.push_back(buf[..n].to_vec());
        }
        let n = wire::encode(&mut buf, &wire::Heartbeat { seq: 1, role: role as u32, id }).expect("heartbeat");
        let side = if i < nf { Side::Frontend { link: i, script: script.clone() } } else { Side::Backend { running: BinaryHeap::new() } };
        node.handle_connection(now, BenchConn { index: i, side, board: board.clone(), hello, heartbeat: buf[..n].to_vec(), next_beat: now.as_nanos() + BEAT });
    }
    for _ in 0..1000 {
        node.poll(clock.now());
        if node.plane().peers() == (nf, nb) {
            break;
        }
    }
    assert_eq!(node.plane().peers(), (nf, nb), "every link registers");
    while node.poll_event().is_some() {}
    // A thread names itself once it runs: wait for the names.
    let mut model_threads = threads_named("sched-model");
    let pinned = a.engine == "pinned";
    for _ in 0..1000 {
        if !pinned || !model_threads.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        model_threads = threads_named("sched-model");
    }
    assert!(!pinned || !model_threads.is_empty(), "the ModelThreads are found by name");
    let rank_threads = threads_named("sched-rank");
    let mut key_of = vec![0u64; nf + nb];
    node.for_each_conn(|key, c| key_of[c.index] = key);

    let received = |m: &SchedulerMetrics| m.tasks_received.get();
    let planned = |m: &SchedulerMetrics| m.models.iter().map(|c| c.dispatched.get()).sum::<u64>();
    let dropped = |m: &SchedulerMetrics| m.drops.iter().map(|c| c.get()).sum::<u64>();
    let t0 = clock.now() + Duration::from_millis(2);
    let load_end = t0 + Duration::from_secs_f64(a.duration_s);
    let give_up = load_end + Duration::from_millis(10_000);
    let mut next_frame = 0usize;
    let mut active: Vec<usize> = Vec::with_capacity(nf);
    let mut is_active = vec![false; nf];
    let mut readable: Vec<u64> = Vec::with_capacity(nf + nb);
    let mut next_beat = t0;
    let (mut passes, mut taken_at_load_end) = (0u64, None);
    while clock.now() < t0 {
        std::hint::spin_loop();
    }
    let (io0, model0, rank0) = (thread_cpu_ns(), cpu_ns_of(&model_threads), cpu_ns_of(&rank_threads));
    let wall0 = std::time::Instant::now();
    let settled = loop {
        let now = clock.now();
        board.now_ns.store(now.as_nanos(), Relaxed);
        let since = now.saturating_since(t0).as_nanos();
        while let Some(f) = script.frames.get(next_frame).filter(|f| f.at_ns <= since) {
            let l = f.link as usize;
            board.released[l].fetch_add(1, Relaxed);
            if !is_active[l] {
                is_active[l] = true;
                active.push(l);
            }
            next_frame += 1;
        }
        // Level-triggered, as epoll reports a socket with bytes left.
        readable.clear();
        active.retain(|&l| {
            let left = board.taken[l].load(Relaxed) < board.released[l].load(Relaxed);
            if left {
                readable.push(key_of[l]);
            }
            is_active[l] = left;
            left
        });
        if let Ok(mut due) = board.due.lock() {
            while let Some(&Reverse((t, i))) = due.peek() {
                if t > now.as_nanos() {
                    break;
                }
                due.pop();
                readable.push(key_of[i]);
            }
        }
        if now >= next_beat {
            next_beat = now + Duration::from_nanos(BEAT);
            readable.extend_from_slice(&key_of);
        }
        node.set_readable(readable.iter().copied());
        let busy = node.poll(now);
        passes += 1;
        while node.poll_event().is_some() {}
        let m = node.plane().metrics();
        if taken_at_load_end.is_none() && now >= load_end {
            taken_at_load_end = Some(received(m));
        }
        if next_frame == script.frames.len() && received(m) == script.tasks && planned(m) + dropped(m) == received(m) && node.plane().batches_in_flight() == 0 {
            break true;
        }
        if now >= give_up {
            break false;
        }
        if busy {
            idle.reset();
        } else {
            let frame_at = script.frames.get(next_frame).map(|f| t0 + Duration::from_nanos(f.at_ns));
            let due_at = board.due.lock().ok().and_then(|d| d.peek().map(|r| Instant::from_nanos(r.0 .0)));
            let next = [node.poll_at(), frame_at, due_at, Some(next_beat)].into_iter().flatten().min().unwrap_or(now + Duration::from_millis(1));
            idle.idle_unless(next.saturating_since(clock.now()), || node.plane().has_decisions());
        }
    };
    let io = thread_cpu_ns() - io0;
    let model = cpu_ns_of(&model_threads) - model0 + cpu_ns_of(&rank_threads) - rank0;
    let m = node.plane().metrics();
    let got = received(m).max(1) as f64;
    let r = RunReport {
        received: received(m),
        planned: planned(m),
        dropped: DropReason::ALL.iter().map(|d| (d.as_str().to_string(), m.drops[d.index()].get())).filter(|(_, n)| *n > 0).collect(),
        taken_per_s: taken_at_load_end.unwrap_or(received(m)) as f64 / a.duration_s,
        io_ns_per_task: io as f64 / got,
        model_ns_per_task: model as f64 / got,
        total_ns_per_task: (io + model) as f64 / got,
        late_plans: board.late_plans.load(Relaxed),
        plans: board.plans.load(Relaxed),
        passes,
        sleeps: idle.sleeps,
        settled,
        wall_s: wall0.elapsed().as_secs_f64(),
    };
    assert_eq!(board.planned_tasks.load(Relaxed), r.planned, "every planned task reached its backend");
    r
}

fn main() {
    let a = Args::parse();
    let spec = parse_model_arg(&format!("m={}", a.profile)).expect("--profile ALPHA_MS,BETA_MS,SLO_MS");
    let script = Arc::new(Script::new(&a, spec.slo));
    println!(
        "node_path: {} frontends, {} backends, {} GPUs, {} models {}; {:.0} tasks/s offered for {} s ({} tasks in {} frames), seed {}, idle {}",
        a.frontends, a.backends, a.gpus, a.models, a.profile, a.rate, a.duration_s, script.tasks, script.frames.len(), a.seed, a.idle
    );
    println!("tasks per message: {:.2}", script.tasks as f64 / script.frames.len().max(1) as f64);
    println!("| run | I/O ns/task | ModelThread ns/task | total ns/task | taken/s during load | planned | dropped | late plans | passes | sleeps | wall s |");
    println!("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    let mut runs = Vec::new();
    for i in 0..a.runs.max(1) {
        let r = run_once(&a, &script);
        let drops: Vec<String> = r.dropped.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} of {} | {} | {} | {:.2}{} |",
            i + 1,
            r.io_ns_per_task,
            r.model_ns_per_task,
            r.total_ns_per_task,
            r.taken_per_s,
            r.planned,
            if drops.is_empty() { "none".to_string() } else { drops.join(", ") },
            r.late_plans,
            r.plans,
            r.passes,
            r.sleeps,
            r.wall_s,
            if r.settled { "" } else { " (not settled)" }
        );
        if a.json {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
        }
        runs.push(r);
    }
    let med = |f: fn(&RunReport) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0);
    println!(
        "median of {}: I/O {:.0} ns/task, ModelThread {:.0} ns/task, total {:.0} ns/task; taken {:.0} tasks/s during load; one core for the I/O thread alone would take {:.2} M tasks/s",
        runs.len(),
        med(|r| r.io_ns_per_task),
        med(|r| r.model_ns_per_task),
        med(|r| r.total_ns_per_task),
        med(|r| r.taken_per_s),
        1e3 / med(|r| r.io_ns_per_task).max(1e-9)
    );
}
