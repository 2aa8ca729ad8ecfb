//! A working single-process cluster for tests and the example server: a
//! [`TaskSink`] that feeds a real [`DeferredScheduler`] driven by a tokio
//! task on the real clock, with emulated GPUs ([`scheduler::gpu`]: a batch
//! occupies its GPU for exactly `l(b)` of the model's profile). When a batch finishes, each
//! member's input is READ from the frontend's staging region through its
//! [`RemoteRef`](dataplane::mem::RemoteRef) (a bounds-checked copy, as the
//! tcp/shm responders do), the model's reference output is computed, and a
//! wire `Completion` (or `Dropped`) is encoded, decoded and routed back,
//! exactly as a remote backend's message would be.
//!
//! The tokio timer has 1 ms granularity and the runtime's threads share
//! the CPU with everything else, so a wake can come late: about 1 ms on an
//! idle machine, and 10-30 ms were seen on the 2-core test machine at load
//! average 9. A schedulable window as narrow as `alpha` (one request's
//! worth of execution, often under 1 ms) would then be missed and its head
//! request dropped, so the scheduler is told to keep every window at least
//! [`ClusterConfig::timer_slack`] wide (`CoreConfig::min_window`); a wake
//! that late still dispatches in time. [`ClusterConfig::control_delay`] is
//! charged as the scheduler's control delay (`NetworkDelay::d_ctrl`).

use crate::metrics::Metrics;
use crate::models::ModelCatalog;
use crate::service::{SinkError, TaskSink};
use crate::staging::Staging;
use crate::tensor::reference_output;
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::wire::{self, CompletionHead, DropReason, OutputKind, Task, TaskStatus};
use scheduler::deferred::{CoreConfig, DeferredScheduler};
use scheduler::gpu::GpuSet;
use scheduler::netdelay::NetworkDelay;
use scheduler::types::{Actions, Request, Scheduler};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

/// Shape of the in-process cluster.
#[derive(Clone, Copy, Debug)]
pub struct ClusterConfig {
    /// Emulated GPUs.
    pub gpus: u32,
    /// Scheduler knobs (the delay is overridden by `timer_slack`).
    pub core: CoreConfig,
    /// The timer's lateness bound: the narrowest schedulable window.
    pub timer_slack: Duration,
    /// Charged before each batch as the scheduler's control delay.
    pub control_delay: Duration,
    /// Tasks queued toward the scheduler before `send` reports it full.
    pub queue: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            gpus: 1,
            core: CoreConfig::default(),
            timer_slack: Duration::from_millis(5),
            control_delay: Duration::from_millis(1),
            queue: 4096,
        }
    }
}

/// The sink side: sends tasks into the cluster's queue.
#[derive(Clone, Debug)]
pub struct LoopbackSink {
    tx: mpsc::Sender<Task>,
}

impl TaskSink for LoopbackSink {
    fn send(&self, task: &Task) -> Result<(), SinkError> {
        self.tx
            .try_send(*task)
            .map_err(|e| SinkError(format!("scheduler queue: {e}")))
    }
}

/// Controls a running in-process cluster.
#[derive(Debug)]
pub struct ClusterHandle {
    stop: watch::Sender<bool>,
    stopped: Arc<AtomicBool>,
    done: oneshot::Receiver<()>,
}

impl ClusterHandle {
    /// Stops the cluster: every request still queued or running is
    /// dropped with reason `Shutdown`. Returns once the loop has ended.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.done.await;
    }
    /// Whether the loop has ended.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

/// Starts the cluster on a thread of its own. Outcomes are routed
/// into `staging`; batches are reported to `metrics`.
pub fn start(
    catalog: &ModelCatalog,
    staging: Arc<Staging>,
    metrics: Arc<Metrics>,
    cfg: ClusterConfig,
) -> (LoopbackSink, ClusterHandle) {
    let (tx, rx) = mpsc::channel(cfg.queue.max(1));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut core = cfg.core;
    core.delay = NetworkDelay {
        d_ctrl: cfg.control_delay,
        d_data: Duration::ZERO,
    };
    core.min_window = core.min_window.max(cfg.timer_slack);
    let specs = catalog.specs();
    let output_len: Vec<usize> = catalog
        .entries()
        .iter()
        .map(|e| e.output.byte_len() as usize)
        .collect();
    let stopped = Arc::new(AtomicBool::new(false));
    let lp = Loop {
        sched: DeferredScheduler::new(&specs, cfg.gpus.max(1), core),
        specs,
        output_len,
        staging,
        metrics,
        clock: MonotonicClock::new(),
        origin: tokio::time::Instant::now(),

        waiting: HashMap::with_capacity(1024),
        gpus: GpuSet::new(cfg.gpus.max(1)),
        actions: Actions::default(),
        msg: vec![0u8; wire::MAX_MESSAGE_LEN],
        input: Vec::with_capacity(4096),
        output: Vec::with_capacity(4096),
    };
    let flag = stopped.clone();
    let (done_tx, done_rx) = oneshot::channel();
    // Its own thread and current-thread runtime: the scheduler's timer must
    // not queue behind hundreds of HTTP tasks on the server's workers.
    let thread = std::thread::Builder::new()
        .name("symphony-cluster".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(rt) => rt.block_on(lp.run(rx, stop_rx)),
                Err(e) => eprintln!("in-process cluster: no runtime: {e}"),
            }
            flag.store(true, Ordering::SeqCst);
            let _ = done_tx.send(());
        });
    if let Err(e) = thread {
        eprintln!("in-process cluster: no thread: {e}");
        stopped.store(true, Ordering::SeqCst);
    }
    (
        LoopbackSink { tx },
        ClusterHandle {
            stop: stop_tx,
            stopped,
            done: done_rx,
        },
    )
}

/// A batch on an emulated GPU.
struct Running {
    model: u32,
    tasks: Vec<(Task, Instant)>,
}

struct Loop {
    sched: DeferredScheduler,
    specs: Vec<scheduler::zoo::ModelSpec>,
    output_len: Vec<usize>,
    staging: Arc<Staging>,
    metrics: Arc<Metrics>,
    clock: MonotonicClock,
    origin: tokio::time::Instant,
    /// Tasks the scheduler holds, by id, with their arrival.
    waiting: HashMap<u64, (Task, Instant)>,
    gpus: GpuSet<Running>,
    actions: Actions,
    msg: Vec<u8>,
    input: Vec<u8>,
    output: Vec<u8>,
}

impl Loop {
    async fn run(mut self, mut rx: mpsc::Receiver<Task>, mut stop: watch::Receiver<bool>) {
        loop {
            let now = self.clock.now();
            self.finish_batches(now);
            if self.sched.poll_at().is_some_and(|t| t <= now) {
                self.sched.on_wake(now, &mut self.actions);
                self.apply(now);
                continue;
            }
            let next = [self.sched.poll_at(), self.gpus.poll_at()]
                .into_iter()
                .flatten()
                .min();
            let sleep_until =
                next.map(|t| self.origin + std::time::Duration::from_nanos(t.as_nanos()));
            tokio::select! {
                t = rx.recv() => match t {
                    Some(task) => self.on_task(task),
                    None => break,
                },
                _ = async { match sleep_until { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {}
                _ = stop.changed() => break,
            }
        }
        self.drop_all();
    }

    fn on_task(&mut self, task: Task) {
        let now = self.clock.now();
        if task.model_id as usize >= self.specs.len() {
            self.send_dropped(task.task_id, DropReason::UnknownModel);
            return;
        }
        let req = Request {
            id: task.task_id,
            model: task.model_id,
            arrival: now,
            deadline: now.saturating_add(Duration::from_nanos(task.budget_ns)),
        };
        self.waiting.insert(task.task_id, (task, now));
        self.sched.on_request(now, req, &mut self.actions);
        self.apply(now);
    }

    fn apply(&mut self, _now: Instant) {
        let mut actions = std::mem::take(&mut self.actions);
        for (req, reason) in actions.drops.drain(..) {
            if self.waiting.remove(&req.id).is_some() {
                self.send_dropped(req.id, reason);
            }
        }
        for plan in &actions.batches {
            let tasks: Vec<(Task, Instant)> = actions
                .members_of(plan)
                .iter()
                .filter_map(|r| self.waiting.remove(&r.id))
                .collect();
            let l = self
                .specs
                .get(plan.model as usize)
                .map_or(Duration::ZERO, |m| {
                    m.profile.latency(plan.members.len() as u32)
                });
            // Cannot fail: the scheduler plans only the GPUs it was given.
            let _ = self.gpus.submit(
                plan.gpu,
                plan.exec_at,
                l,
                Running {
                    model: plan.model,
                    tasks,
                },
            );
        }
        actions.clear();
        self.actions = actions;
    }

    fn finish_batches(&mut self, now: Instant) {
        while let Some(done) = self.gpus.pop_finished(now) {
            let batch = done.tag;
            let size = batch.tasks.len() as u32;
            let compute = done.finish.saturating_since(done.start);
            let queued: u64 = batch
                .tasks
                .iter()
                .map(|(_, a)| done.start.saturating_since(*a).as_nanos() / 1000)
                .sum();
            self.metrics
                .record_batch(batch.model, size, compute.as_nanos() / 1000, queued);
            for (task, _) in &batch.tasks {
                self.execute(task);
            }
            self.sched
                .on_batch_done(now, done.device, &mut self.actions);
            self.apply(now);
        }
    }

    /// READs the task's input from the staging region and answers with the
    /// model's reference output.
    fn execute(&mut self, task: &Task) {
        let reg = self.staging.registration();
        let r = task.input;
        let out_len = self
            .output_len
            .get(task.model_id as usize)
            .copied()
            .unwrap_or(0);
        self.input.resize(r.len as usize, 0);
        let read_ok = r.key == reg.key()
            && r.offset >= reg.addr_base()
            && reg
                .region()
                .read_at(r.offset - reg.addr_base(), &mut self.input)
                .is_ok();
        let mut head = CompletionHead {
            task_id: task.task_id,
            ..CompletionHead::default()
        };
        self.output.resize(out_len, 0);
        let n = if read_ok {
            reference_output(task.model_id, &self.input, &mut self.output);
            head.status = TaskStatus::Ok as u32;
            head.output_kind = OutputKind::Inline as u32;
            wire::encode_completion(&mut self.msg, &head, &self.output)
        } else {
            head.status = TaskStatus::InputUnavailable as u32;
            head.output_kind = OutputKind::None as u32;
            wire::encode_completion(&mut self.msg, &head, &[])
        };
        self.deliver(n);
    }

    fn send_dropped(&mut self, task_id: u64, reason: DropReason) {
        let d = wire::Dropped {
            task_id,
            reason: reason.code(),
            reserved: 0,
        };
        let n = wire::encode(&mut self.msg, &d);
        self.deliver(n);
    }

    fn deliver(&mut self, n: Result<usize, wire::WireError>) {
        if let Ok(n) = n {
            if let Ok(m) = wire::decode(&self.msg[..n]) {
                let _ = self.staging.route_message(&m);
            }
        }
    }

    fn drop_all(&mut self) {
        let ids: Vec<u64> = self
            .waiting
            .drain()
            .map(|(id, _)| id)
            .chain(
                std::iter::from_fn(|| self.gpus.pop_finished(Instant::NEVER))
                    .flat_map(|r| r.tag.tasks.into_iter().map(|(t, _)| t.task_id)),
            )
            .collect();
        for id in ids {
            self.send_dropped(id, DropReason::Shutdown);
        }
    }
}
