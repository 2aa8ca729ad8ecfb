//! Test harness: real transports on one host. Each frontend is a thread
//! with its own domain, a registered region of staged inputs and a
//! listener; the backend worker (in the test thread) connects to every
//! frontend and to a scheduler end that the test thread drives itself.
//! Every wait has a deadline; idle loops yield, then sleep briefly.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use backend::exec::ExecModel;
use backend::output::expected_output;
use backend::{BatchWorker, EmulatedExecutor, WorkerConfig};
use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, Instant};
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::TcpDomain;
use dataplane::transport::{Connection, Domain, Error, Listener, Registration};
use dataplane::wire::{self, BatchPlanHead, BatchTask, Message, RemoteRef};
use scheduler::profile::LatencyProfile;

/// Bound for every wait.
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// A transport under test.
pub trait Net: Copy + Send + 'static {
    /// Domain type.
    type D: Domain;
    /// Name.
    fn name(self) -> &'static str;
    /// A fresh domain.
    fn domain(self) -> Self::D;
    /// A region that peers can READ.
    fn region(self, len: usize) -> Arc<Region>;
}

/// Shared memory.
#[derive(Clone, Copy)]
pub struct Shm;
impl Net for Shm {
    type D = ShmDomain;
    fn name(self) -> &'static str {
        "shm"
    }
    fn domain(self) -> ShmDomain {
        ShmDomain::new().expect("shm domain")
    }
    fn region(self, len: usize) -> Arc<Region> {
        Region::shared(len).expect("shared region")
    }
}

/// TCP (io_uring when usable, else the blocking engine).
#[derive(Clone, Copy)]
pub struct Tcp;
impl Net for Tcp {
    type D = TcpDomain;
    fn name(self) -> &'static str {
        "tcp"
    }
    fn domain(self) -> TcpDomain {
        TcpDomain::uring()
            .or_else(|_| TcpDomain::blocking())
            .expect("tcp domain")
    }
    fn region(self, len: usize) -> Arc<Region> {
        Region::anonymous(len).expect("region")
    }
}

/// Deterministic bytes.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A completion as a frontend (or the scheduler) received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Got {
    pub task_id: u64,
    pub status: u32,
    pub output: Vec<u8>,
}

/// What a frontend thread does with its connection.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Serve READs and collect completions until stopped.
    Serve,
    /// Never poll (READs stall on tcp) until told to drop the connection.
    StallThenDrop,
}

/// One frontend: staged inputs and the thread that owns the connection.
pub struct Frontend {
    pub id: u32,
    pub addr: String,
    pub reg: Registration,
    pub region: Arc<Region>,
    pub inputs: Vec<Vec<u8>>,
    pub got: Arc<Mutex<Vec<Got>>>,
    pub stop: Arc<AtomicBool>,
    pub drop_now: Option<mpsc::Sender<()>>,
    pub thread: Option<JoinHandle<()>>,
}

pub const SLOT: usize = 256;

impl Frontend {
    /// A frontend with `n` staged inputs of 1..=SLOT bytes.
    pub fn start<N: Net>(net: N, id: u32, n: usize, seed: u64, mode: Mode) -> Frontend {
        let dom = net.domain();
        let region = net.region(n * SLOT);
        let mut rng = Rng::new(seed);
        let mut inputs = Vec::with_capacity(n);
        for k in 0..n {
            let len = 1 + (rng.next() as usize % SLOT);
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            region.write_at((k * SLOT) as u64, &bytes).unwrap();
            inputs.push(bytes);
        }
        let reg = dom
            .register(&region, Access::REMOTE_READ)
            .expect("register inputs");
        let mut listener = dom.listen("").expect("listen");
        let addr = listener.local_addr();
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<()>();
        let (got2, stop2) = (got.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let _keep = dom.clone();
            let t = Duration::from_nanos(TIMEOUT.as_nanos() as u64);
            let mut conn = listener.accept(t).expect("frontend accept");
            // This test frontend serves the backend's READs from the start.
            conn.allow_remote_reads();
            if mode == Mode::StallThenDrop {
                let _ = rx.recv_timeout(TIMEOUT);
                drop(conn);
                return;
            }
            serve(&mut conn, &got2, &stop2);
        });
        Frontend {
            id,
            addr,
            reg,
            region,
            inputs,
            got,
            stop,
            drop_now: Some(tx),
            thread: Some(thread),
        }
    }

    /// The READ reference of input `k`.
    pub fn input_ref(&self, k: usize) -> RemoteRef {
        self.reg
            .remote_ref((k * SLOT) as u64, self.inputs[k].len() as u32)
            .unwrap()
    }

    pub fn task_id(&self, k: usize) -> u64 {
        (u64::from(self.id) << 32) | k as u64
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("frontend thread");
        }
    }
}

impl Drop for Frontend {
    fn drop(&mut self) {
        self.drop_now.take();
        self.stop();
    }
}

/// Serves READs and collects completions, blocking in `wait` when idle.
fn serve<C: Connection>(conn: &mut C, got: &Mutex<Vec<Got>>, stop: &AtomicBool) {
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let deadline = std::time::Instant::now() + TIMEOUT * 3;
    while !stop.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        loop {
            match conn.try_recv(&mut buf) {
                Ok(Some(n)) => {
                    if let Ok(Message::Completion(h, inline)) = wire::decode(&buf[..n]) {
                        got.lock().unwrap().push(Got {
                            task_id: h.task_id,
                            status: h.status,
                            output: inline.to_vec(),
                        });
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        match conn.wait(Duration::from_millis(2)) {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(std::time::Duration::from_micros(100)),
            Err(_) => return,
        }
    }
}

/// Two models: output 48 and 100 bytes.
pub fn models() -> Vec<ExecModel> {
    vec![
        ExecModel {
            profile: LatencyProfile::linear(0.2, 1.0, 64).unwrap(),
            output_len: 48,
        },
        ExecModel {
            profile: LatencyProfile::linear(0.1, 2.0, 64).unwrap(),
            output_len: 100,
        },
    ]
}

pub fn config() -> WorkerConfig {
    WorkerConfig {
        max_batch: 32,
        input_slot: SLOT as u32,
        output_slot: 128,
        batch_slots: 16,
        max_frontends: 8,
        control_delay: Duration::ZERO,
        fetch_grace: Duration::from_millis(2_000),
        report_capacity: 64,
        start_when_ready: false,
    }
}

/// The backend side: worker + the scheduler's end of its connection.
pub struct Rig<N: Net> {
    pub worker: BatchWorker<<N::D as Domain>::Conn, EmulatedExecutor>,
    pub sched: <N::D as Domain>::Conn,
    pub frontends: Vec<Frontend>,
    pub backend_dom: N::D,
    pub sched_dom: N::D,
    pub msg: Vec<u8>,
    pub at_scheduler: Vec<Got>,
    pub done: Vec<(wire::BatchDone, std::time::Instant)>,
}

impl<N: Net> Rig<N> {
    pub fn new(net: N, cfg: WorkerConfig, gpus: u32, frontends: Vec<Frontend>) -> Rig<N> {
        let backend_dom = net.domain();
        let sched_dom = net.domain();
        let staging = Region::anonymous(cfg.staging_bytes() as usize).unwrap();
        let staging_reg = backend_dom.register(&staging, Access::LOCAL_WRITE).unwrap();
        let exec = EmulatedExecutor::new(staging, gpus, cfg.max_batch, models());
        let t = Duration::from_nanos(TIMEOUT.as_nanos() as u64);
        let mut l = sched_dom.listen("").unwrap();
        let addr = l.local_addr();
        let (sched, to_sched) = std::thread::scope(|s| {
            let acc = s.spawn(move || l.accept(t).expect("scheduler accept"));
            let c = backend_dom.connect(&addr, t).expect("connect scheduler");
            (acc.join().unwrap(), c)
        });
        let mut worker = BatchWorker::new(cfg, exec, staging_reg, to_sched).unwrap();
        for f in &frontends {
            let c = backend_dom.connect(&f.addr, t).expect("connect frontend");
            worker.add_frontend(f.id, c).unwrap();
        }
        Rig {
            worker,
            sched,
            frontends,
            backend_dom,
            sched_dom,
            msg: vec![0; wire::MAX_MESSAGE_LEN],
            at_scheduler: Vec::new(),
            done: Vec::new(),
        }
    }

    /// Sends a plan from the scheduler end.
    pub fn send_plan(&mut self, head: BatchPlanHead, tasks: &[BatchTask]) {
        let n = wire::encode_batch_plan(&mut self.msg, &head, tasks).unwrap();
        let until = std::time::Instant::now() + TIMEOUT;
        loop {
            match self.sched.send(&self.msg[..n]) {
                Ok(()) => return,
                Err(Error::QueueFull) => {}
                Err(e) => panic!("send plan: {e}"),
            }
            let _ = self.sched.progress();
            assert!(std::time::Instant::now() < until, "plan not sent");
            std::thread::yield_now();
        }
    }

    /// Takes what the scheduler end received.
    pub fn drain_scheduler(&mut self) {
        loop {
            match self.sched.try_recv(&mut self.msg) {
                Ok(Some(n)) => match wire::decode(&self.msg[..n]).unwrap() {
                    Message::BatchDone(d) => self.done.push((d, std::time::Instant::now())),
                    Message::Completion(h, inline) => self.at_scheduler.push(Got {
                        task_id: h.task_id,
                        status: h.status,
                        output: inline.to_vec(),
                    }),
                    m => panic!("unexpected at scheduler: {m:?}"),
                },
                Ok(None) => return,
                Err(e) => panic!("scheduler recv: {e}"),
            }
        }
    }

    /// Polls the worker on `now()` until `cond` holds.
    pub fn run_until(
        &mut self,
        mut now: impl FnMut() -> Instant,
        mut cond: impl FnMut(&mut Self) -> bool,
    ) {
        let until = std::time::Instant::now() + TIMEOUT;
        let mut idle = 0u32;
        loop {
            let progressed = self.worker.poll(now()).expect("worker poll");
            self.drain_scheduler();
            if cond(self) {
                return;
            }
            assert!(
                std::time::Instant::now() < until,
                "condition not reached before the deadline"
            );
            if progressed {
                idle = 0;
            } else {
                idle += 1;
                if idle < 32 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
    }

    /// Every completion that reached frontends, by task id.
    pub fn frontend_completions(&self) -> Vec<Got> {
        let mut all = Vec::new();
        for f in &self.frontends {
            all.extend(f.got.lock().unwrap().iter().cloned());
        }
        all
    }
}

/// The expected output of frontend `f`'s input `k` under `model`.
pub fn expected(f: &Frontend, k: usize, model: u32) -> Vec<u8> {
    let len = models()[model as usize].output_len as usize;
    let mut out = vec![0u8; len];
    expected_output(model, &f.inputs[k], &mut out);
    out
}

pub fn task(f: &Frontend, k: usize) -> BatchTask {
    BatchTask {
        task_id: f.task_id(k),
        frontend_id: f.id,
        queued_us: 0,
        input: f.input_ref(k),
        capability: Default::default(),
    }
}
