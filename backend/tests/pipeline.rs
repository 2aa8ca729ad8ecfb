//! The batch pipeline over real transports (shm and tcp on loopback):
//! plans in, READs, emulated execution, outputs back.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use backend::exec::Executor;
use common::*;
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::Connection;
use dataplane::wire::{BatchPlanHead, BatchTask, RemoteRef, TaskStatus};

static SEED: AtomicU64 = AtomicU64::new(0x5eed);

fn seed() -> u64 {
    SEED.fetch_add(0x1000, Ordering::Relaxed)
}

struct Planned {
    batch_id: u64,
    gpu: u32,
    model: u32,
    tasks: Vec<(usize, usize)>, // (frontend index, input index)
}

/// 12 batches over 2 GPUs and 3 frontends, sizes 1..=32, each GPU's
/// batches spaced so they never overlap; every task gets exactly one
/// completion, at its frontend, with the right bytes; timing is exact in
/// executor terms and close to the real clock.
fn serves_every_task<N: Net>(net: N) {
    let frontends: Vec<Frontend> = (0..3)
        .map(|i| Frontend::start(net, i + 1, 200, seed(), Mode::Serve))
        .collect();
    let mut rig = Rig::new(net, config(), 2, frontends);
    let clock = MonotonicClock::new();
    let mut rng = Rng::new(seed());
    let mut next_input = [0usize; 3];
    let mut plans = Vec::new();
    for b in 0..12u64 {
        let gpu = (b % 2) as u32;
        let model = (b / 2 % 2) as u32;
        let size = [1, 32, 7, 16, 3, 25][(b % 6) as usize];
        let mut tasks = Vec::new();
        let mut wire_tasks: Vec<BatchTask> = Vec::new();
        for _ in 0..size {
            let fi = (rng.next() % 3) as usize;
            let k = next_input[fi];
            next_input[fi] += 1;
            wire_tasks.push(task(&rig.frontends[fi], k));
            tasks.push((fi, k));
        }
        // Batch k of a GPU at 150 ms + k * 12 ms: l(b) <= 7.4 ms never overlaps.
        let exec_in = Duration::from_millis(150 + (b / 2) * 12);
        let head = BatchPlanHead {
            batch_id: 100 + b,
            exec_in_ns: exec_in.as_nanos(),
            model_id: model,
            gpu_id: gpu,
            count: 0,
            run_ns: 0,
            epoch: 0,
        };
        rig.send_plan(head, &wire_tasks);
        plans.push(Planned {
            batch_id: 100 + b,
            gpu,
            model,
            tasks,
        });
    }
    let total: usize = plans.iter().map(|p| p.tasks.len()).sum();
    rig.run_until(|| clock.now(), |r| r.done.len() == plans.len());
    // Completions are queued before each BatchDone; give the frontends
    // their bounded time to read them.
    let until = std::time::Instant::now() + TIMEOUT;
    while rig.frontend_completions().len() < total {
        assert!(
            std::time::Instant::now() < until,
            "{}: completions missing",
            net.name()
        );
        rig.worker.poll(clock.now()).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }

    let got = rig.frontend_completions();
    let mut by_task: HashMap<u64, Vec<&Got>> = HashMap::new();
    for g in &got {
        by_task.entry(g.task_id).or_default().push(g);
    }
    assert_eq!(got.len(), total, "{}: one completion per task", net.name());
    for p in &plans {
        for &(fi, k) in &p.tasks {
            let f = &rig.frontends[fi];
            let g = by_task.get(&f.task_id(k)).expect("task answered");
            assert_eq!(g.len(), 1, "exactly one outcome");
            assert_eq!(g[0].status, TaskStatus::Ok as u32);
            assert_eq!(
                g[0].output,
                expected(f, k, p.model),
                "output bytes of task {k}"
            );
        }
    }
    assert!(rig.at_scheduler.is_empty());

    // Timing: BatchDone carries l(b); reports are exact in executor time
    // and the real clock saw them close to the planned finish.
    let models = models();
    let mut reports = Vec::new();
    while let Some(r) = rig.worker.pop_report() {
        reports.push(r);
    }
    assert_eq!(reports.len(), plans.len());
    for p in &plans {
        let r = reports.iter().find(|r| r.batch_id == p.batch_id).unwrap();
        let l = models[p.model as usize]
            .profile
            .latency(p.tasks.len() as u32);
        let (start, finish) = (r.start.unwrap(), r.finish.unwrap());
        assert!(start >= r.exec_at, "never before exec_at");
        // Real clock on a shared 2-core box: the fetch can be preempted;
        // exactness is checked on the virtual clock below.
        let late = start.saturating_since(r.exec_at);
        assert!(
            late < Duration::from_millis(1_000),
            "{}: started {late} late",
            net.name()
        );
        assert_eq!(
            finish.saturating_since(start),
            l,
            "occupies the GPU for exactly l(b)"
        );
        let (d, seen) = rig
            .done
            .iter()
            .find(|(d, _)| d.batch_id == p.batch_id)
            .unwrap();
        assert_eq!(Duration::from_nanos(d.actual_ns()), l);
        assert_eq!((d.gpu_id, d.count), (p.gpu, p.tasks.len() as u32));
        // Every input READ completed; the slowest is what the report says.
        assert_eq!(d.reads, p.tasks.len() as u32);
        assert_eq!(Duration::from_nanos(d.read_max_ns), r.read_max);
        let _ = seen;
    }
    for gpu in 0..2 {
        let mut iv: Vec<(Instant, Instant)> = reports
            .iter()
            .filter(|r| r.gpu == gpu)
            .map(|r| (r.start.unwrap(), r.finish.unwrap()))
            .collect();
        iv.sort();
        for w in iv.windows(2) {
            assert!(w[0].1 <= w[1].0, "batches overlap on gpu {gpu}");
        }
    }
    let s = rig.worker.stats();
    assert_eq!(
        (s.tasks_ok, s.tasks_failed, s.batches_executed),
        (total as u64, 0, 12)
    );
    assert_eq!(
        rig.worker.batches_in_flight(),
        0,
        "every batch buffer is free again"
    );
}

/// On a virtual clock that moves only when no I/O is pending, a batch
/// starts exactly at exec_at and ends exactly l(b) later.
fn virtual_clock_is_exact<N: Net>(net: N) {
    let frontends = vec![Frontend::start(net, 1, 64, seed(), Mode::Serve)];
    let mut rig = Rig::new(net, config(), 1, frontends);
    let mut now = Instant::from_nanos(1_000_000_000);
    let models = models();
    for b in 0..4u64 {
        let size = [5usize, 1, 32, 9][b as usize];
        let tasks: Vec<BatchTask> = (0..size)
            .map(|k| task(&rig.frontends[0], b as usize * 16 + k % 16))
            .collect();
        let head = BatchPlanHead {
            batch_id: b,
            exec_in_ns: Duration::from_millis(10).as_nanos(),
            model_id: 0,
            gpu_id: 0,
            count: 0,
            run_ns: 0,
            epoch: 0,
        };
        rig.send_plan(head, &tasks);
        let received_at = now;
        let until = std::time::Instant::now() + TIMEOUT;
        loop {
            rig.worker.poll(now).unwrap();
            rig.drain_scheduler();
            if rig.done.len() as u64 == b + 1 {
                break;
            }
            assert!(std::time::Instant::now() < until, "batch {b} not done");
            if rig.worker.batches_in_flight() == 0 || rig.worker.io_pending() {
                std::thread::yield_now();
                continue;
            }
            if let Some(t) = rig.worker.next_wakeup() {
                now = now.max(t);
            }
        }
        let r = rig.worker.pop_report().unwrap();
        let l = models[0].profile.latency(size as u32);
        assert_eq!(r.received, received_at);
        assert_eq!(r.exec_at, received_at + Duration::from_millis(10));
        assert_eq!(
            r.start,
            Some(r.exec_at),
            "{}: starts exactly at exec_at",
            net.name()
        );
        assert_eq!(r.finish, Some(r.exec_at + l));
        assert_eq!(rig.done[b as usize].0.actual_ns(), l.as_nanos());
        assert_eq!(now, r.exec_at + l, "no time passed beyond the finish");
        // The next plan arrives later on the virtual clock.
        now += Duration::from_millis(1);
    }
    assert_eq!(rig.worker.executor().busy_rejections(), 0);
}

/// Frontend B goes away while its READs are in flight (tcp: B never
/// served them; shm: B is gone before the READs are posted); one of A's
/// inputs names a bad key. Only those tasks fail; the rest of the batch
/// runs and is answered.
fn dead_frontend_fails_only_its_tasks<N: Net>(net: N) {
    let a = Frontend::start(net, 1, 32, seed(), Mode::Serve);
    let b = Frontend::start(net, 2, 32, seed(), Mode::StallThenDrop);
    let mut rig = Rig::new(net, config(), 1, vec![a, b]);
    let clock = MonotonicClock::new();
    let mut tasks = Vec::new();
    for k in 0..10 {
        tasks.push(task(&rig.frontends[0], k));
        tasks.push(task(&rig.frontends[1], k));
    }
    let bogus = BatchTask {
        task_id: 0xdead,
        frontend_id: 1,
        queued_us: 0,
        input: RemoteRef {
            key: 0x7777_0042,
            len: 16,
            offset: 0,
        },
        capability: Default::default(),
    };
    tasks.push(bogus);
    let shm = net.name() == "shm";
    if shm {
        // Synchronous READs: make B gone before the plan.
        rig.frontends[1].drop_now.take();
        rig.frontends[1].stop();
        let until = std::time::Instant::now() + TIMEOUT;
        while rig.worker.frontend(2).unwrap().is_connected() {
            assert!(std::time::Instant::now() < until);
            let _ = rig.worker.frontend(2).unwrap().progress();
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
    let head = BatchPlanHead {
        batch_id: 9,
        exec_in_ns: Duration::from_millis(20).as_nanos(),
        model_id: 1,
        gpu_id: 0,
        count: 0,
        run_ns: 0,
            epoch: 0,
    };
    rig.send_plan(head, &tasks);
    if !shm {
        rig.run_until(|| clock.now(), |r| r.worker.stats().reads_posted == 21);
        // B drops its connection with 10 READs outstanding.
        rig.frontends[1].drop_now.take();
        rig.frontends[1].stop();
    }
    rig.run_until(|| clock.now(), |r| r.done.len() == 1);
    let until = std::time::Instant::now() + TIMEOUT;
    while rig.frontends[0].got.lock().unwrap().len() < 11 {
        assert!(std::time::Instant::now() < until, "A's completions missing");
        rig.worker.poll(clock.now()).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let got_a = rig.frontends[0].got.lock().unwrap().clone();
    assert_eq!(got_a.len(), 11);
    for k in 0..10 {
        let g: Vec<_> = got_a
            .iter()
            .filter(|g| g.task_id == rig.frontends[0].task_id(k))
            .collect();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].status, TaskStatus::Ok as u32);
        assert_eq!(g[0].output, expected(&rig.frontends[0], k, 1));
    }
    let bad: Vec<_> = got_a.iter().filter(|g| g.task_id == 0xdead).collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].status, TaskStatus::InputUnavailable as u32);
    // B's tasks: error completions rerouted to the scheduler, one each.
    assert_eq!(rig.at_scheduler.len(), 10, "{}", net.name());
    for k in 0..10 {
        let id = rig.frontends[1].task_id(k);
        let g: Vec<_> = rig
            .at_scheduler
            .iter()
            .filter(|g| g.task_id == id)
            .collect();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].status, TaskStatus::InputUnavailable as u32);
    }
    let (d, _) = rig.done[0];
    assert_eq!(d.count, 10, "the batch ran with A's 10 inputs");
    assert_eq!(d.actual_ns(), models()[1].profile.latency(10).as_nanos());
    // The batch buffer comes back once B's READs have all completed.
    rig.run_until(|| clock.now(), |r| r.worker.batches_in_flight() == 0);
    let s = rig.worker.stats();
    assert_eq!(
        (s.tasks_ok, s.tasks_failed, s.rerouted_to_scheduler),
        (10, 11, 10)
    );
}

/// A plan naming an unknown GPU or model fails all its tasks back (never
/// reaching the executor) and still reports BatchDone.
fn bad_plan_is_answered<N: Net>(net: N) {
    let frontends = vec![Frontend::start(net, 1, 8, seed(), Mode::Serve)];
    let mut rig = Rig::new(net, config(), 1, frontends);
    let clock = MonotonicClock::new();
    let tasks: Vec<BatchTask> = (0..3).map(|k| task(&rig.frontends[0], k)).collect();
    let head = BatchPlanHead {
        batch_id: 1,
        exec_in_ns: 0,
        model_id: 0,
        gpu_id: 7,
        count: 0,
        run_ns: 0,
            epoch: 0,
    };
    rig.send_plan(head, &tasks);
    rig.run_until(|| clock.now(), |r| r.done.len() == 1);
    let until = std::time::Instant::now() + TIMEOUT;
    while rig.frontends[0].got.lock().unwrap().len() < 3 {
        assert!(std::time::Instant::now() < until);
        rig.worker.poll(clock.now()).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let got = rig.frontends[0].got.lock().unwrap().clone();
    assert!(got
        .iter()
        .all(|g| g.status == TaskStatus::ExecFailed as u32));
    assert_eq!((rig.done[0].0.count, rig.done[0].0.actual_ns()), (0, 0));
    assert_eq!(rig.worker.stats().batches_executed, 0);
}

/// The scheduler goes away with a batch in flight: the batch still runs
/// and its frontend still gets every answer; polls report SchedulerGone.
fn scheduler_loss_still_answers_frontends<N: Net>(net: N) {
    let frontends = vec![Frontend::start(net, 1, 16, seed(), Mode::Serve)];
    let mut rig = Rig::new(net, config(), 1, frontends);
    let clock = MonotonicClock::new();
    let tasks: Vec<BatchTask> = (0..8).map(|k| task(&rig.frontends[0], k)).collect();
    let head = BatchPlanHead {
        batch_id: 5,
        exec_in_ns: Duration::from_millis(30).as_nanos(),
        model_id: 0,
        gpu_id: 0,
        count: 0,
        run_ns: 0,
            epoch: 0,
    };
    rig.send_plan(head, &tasks);
    rig.run_until(|| clock.now(), |r| r.worker.batches_in_flight() == 1);
    let Rig {
        mut worker,
        sched,
        frontends,
        ..
    } = rig;
    drop(sched);
    let until = std::time::Instant::now() + TIMEOUT;
    let mut gone = false;
    while frontends[0].got.lock().unwrap().len() < 8 {
        assert!(
            std::time::Instant::now() < until,
            "{}: answers missing",
            net.name()
        );
        match worker.poll(clock.now()) {
            Ok(_) => {}
            Err(backend::WorkerError::SchedulerGone) => gone = true,
            Err(e) => panic!("unexpected: {e}"),
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    assert!(gone || worker.poll(clock.now()).is_err(), "loss reported");
    let got = frontends[0].got.lock().unwrap().clone();
    for k in 0..8 {
        let g: Vec<_> = got
            .iter()
            .filter(|g| g.task_id == frontends[0].task_id(k))
            .collect();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].output, expected(&frontends[0], k, 0));
    }
}

#[test]
fn shm_scheduler_loss_still_answers_frontends() {
    scheduler_loss_still_answers_frontends(Shm);
}
#[test]
fn tcp_scheduler_loss_still_answers_frontends() {
    scheduler_loss_still_answers_frontends(Tcp);
}

#[test]
fn shm_serves_every_task() {
    serves_every_task(Shm);
}
#[test]
fn tcp_serves_every_task() {
    serves_every_task(Tcp);
}
#[test]
fn shm_virtual_clock_is_exact() {
    virtual_clock_is_exact(Shm);
}
#[test]
fn tcp_virtual_clock_is_exact() {
    virtual_clock_is_exact(Tcp);
}
#[test]
fn shm_dead_frontend_fails_only_its_tasks() {
    dead_frontend_fails_only_its_tasks(Shm);
}
#[test]
fn tcp_dead_frontend_fails_only_its_tasks() {
    dead_frontend_fails_only_its_tasks(Tcp);
}
#[test]
fn shm_bad_plan_is_answered() {
    bad_plan_is_answered(Shm);
}
#[test]
fn tcp_bad_plan_is_answered() {
    bad_plan_is_answered(Tcp);
}

#[test]
fn executor_trait_is_object_safe_enough_for_the_worker() {
    // The worker is generic; this only pins the trait's shape.
    fn _takes(_: &dyn Executor) {}
}

/// Scheduler messages that are not plans are handed to the caller in
/// order (with the plans still executing); a full control queue stops the
/// reading (back-pressure, nothing lost); a worker not taking plans leaves
/// them in the transport.
fn control_messages_reach_the_caller<N: Net>(net: N) {
    use backend::{ControlMessage, CONTROL_QUEUE_CAPACITY};
    use dataplane::wire::{self, Heartbeat, Register, Role};
    let frontends = vec![Frontend::start(net, 1, 8, seed(), Mode::Serve)];
    let mut rig = Rig::new(net, config(), 1, frontends);
    let clock = MonotonicClock::new();
    let send_control = |rig: &mut Rig<N>, k: u32| {
        let mut buf = [0u8; 256];
        let n = if k & 1 == 0 {
            wire::encode(&mut buf, &Register::new(Role::Frontend, k, 0, "fe-addr")).unwrap()
        } else {
            let hb = Heartbeat {
                seq: u64::from(k),
                role: Role::Scheduler as u32,
                id: 0,
            };
            wire::encode(&mut buf, &hb).unwrap()
        };
        let until = std::time::Instant::now() + TIMEOUT;
        while rig.sched.send(&buf[..n]).is_err() {
            let _ = rig.sched.progress();
            assert!(
                std::time::Instant::now() < until,
                "control message not sent"
            );
            std::thread::yield_now();
        }
    };
    let total = CONTROL_QUEUE_CAPACITY as u32 + 6;
    for k in 0..total {
        send_control(&mut rig, k);
    }
    let head = BatchPlanHead {
        batch_id: 9,
        exec_in_ns: 0,
        model_id: 0,
        gpu_id: 0,
        count: 0,
        run_ns: 0,
            epoch: 0,
    };
    let tasks: Vec<BatchTask> = (0..2).map(|k| task(&rig.frontends[0], k)).collect();
    rig.send_plan(head, &tasks);
    // Nobody pops: the worker reads until its control queue is full, then
    // stops (the plan behind stays in the transport).
    rig.run_until(|| clock.now(), |r| r.worker.scheduler_backlogged());
    for _ in 0..50 {
        rig.worker.poll(clock.now()).unwrap();
    }
    assert_eq!(
        rig.worker.stats().control_messages,
        CONTROL_QUEUE_CAPACITY as u64
    );
    assert_eq!(rig.worker.stats().plans, 0);
    assert!(rig.worker.scheduler_heard_at() > Instant::ZERO);
    let mut seen = 0u32;
    let pop_all = |rig: &mut Rig<N>, seen: &mut u32| {
        while let Some(m) = rig.worker.pop_control() {
            match m {
                ControlMessage::Register(r) => {
                    assert_eq!(*seen & 1, 0);
                    assert_eq!(
                        (r.role(), r.id, r.endpoint()),
                        (Some(Role::Frontend), *seen, "fe-addr")
                    );
                }
                ControlMessage::Heartbeat(h) => assert_eq!(h.seq, u64::from(*seen)),
                ControlMessage::Drain(d) => panic!("no drain message was sent: {d:?}"),
            }
            *seen += 1;
        }
    };
    pop_all(&mut rig, &mut seen);
    rig.run_until(|| clock.now(), |r| r.done.len() == 1);
    pop_all(&mut rig, &mut seen);
    assert_eq!(seen, total, "every control message, in order");
    assert_eq!(rig.done[0].0.count, 2);
    // Not taking plans: a new plan waits in the transport.
    rig.worker.set_taking_plans(false);
    let head2 = BatchPlanHead {
        batch_id: 10,
        ..head
    };
    rig.send_plan(head2, &tasks);
    for _ in 0..200 {
        rig.worker.poll(clock.now()).unwrap();
        std::thread::yield_now();
    }
    assert_eq!(rig.worker.stats().plans, 1);
    rig.worker.set_taking_plans(true);
    rig.run_until(|| clock.now(), |r| r.done.len() == 2);
    assert_eq!(rig.done[1].0.batch_id, 10);
}

#[test]
fn shm_control_messages_reach_the_caller() {
    control_messages_reach_the_caller(Shm);
}

#[test]
fn tcp_control_messages_reach_the_caller() {
    control_messages_reach_the_caller(Tcp);
}
