//! The synthetic backends of `symphony bench-cluster`: one process, many
//! registered backend links (the real join handshake, each holding every
//! model), one `gpu::GpuSet` for all their GPUs. A plan runs on its
//! device from its planned start for exactly the profiled `l(b)` and is
//! reported with a real `BatchDone`; no READs, no execution, no
//! completions to frontends. With the scheduler's benchmark stamps it
//! measures the dispatch lag (planned dispatch moment -> plan received)
//! and counts plans that arrived after their planned start.

use super::BenchClusterError;
use std::io::Write as _;

use dataplane::control;
use dataplane::time::{host_monotonic_ns, Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Error};
use dataplane::waitset::WaitSet;
use dataplane::wire::{self, BatchDone, BenchStamp, Message, Role};
use scheduler::gpu::GpuSet;
use scheduler::zoo::parse_model_arg;

use super::peer::{self, beat, gpus_of, join_all, ns_hist, write_report, LagUs, PeerArgs};

/// Messages taken per link per loop turn at most.
const RECV_BURST: usize = 256;
/// Longest sleep of an idle loop turn (the stop request is checked after).
const IDLE_CAP: Duration = Duration::from_millis(10);

/// What the backends process saw, written to its report file.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct BackendsReport {
    pub gpus: u32,
    pub plans: u64,
    pub tasks: u64,
    /// Plans received after their planned start (they start late).
    pub late_plans: u64,
    /// Tasks of batches that finished after their earliest deadline.
    pub late_tasks: u64,
    /// Plans naming a GPU the backend does not have, or refused by the codec.
    pub bad_messages: u64,
    /// Plans without a preceding stamp (the scheduler runs without --bench-stamps).
    pub unstamped_plans: u64,
    pub batches_done: u64,
    /// Planned dispatch moment -> plan received.
    pub dispatch_lag: LagUs,
    /// CPU time over wall time from registration to the stop (1.0 = one core busy).
    pub cpu_busy: f64,
}

/// A batch on its device: (link index, batch id, local GPU, tasks).
type Tag = (u32, u64, u32, u32);

pub fn run<D: Domain>(domain: D, a: PeerArgs) -> Result<(), BenchClusterError> {
    let spec = parse_model_arg(&format!("m={}", a.profile))?;
    let clock = MonotonicClock::new();
    let (links, welcome) = join_all(&domain, &a, Role::Backend, &clock, |i| gpus_of(i, a.peers, a.gpus))?;
    let mut first_gpu = Vec::with_capacity(links.len());
    let mut total = 0u32;
    for i in 0..a.peers {
        first_gpu.push(total);
        total += gpus_of(i, a.peers, a.gpus);
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "READY backends={} gpus={total}", links.len());
        let _ = out.flush();
    }
    let (began, cpu_at_start) = (clock.now(), peer::cpu_s_self());
    // Which links have bytes: one epoll_wait per turn instead of a `recv`
    // per link (256 of them, mostly EAGAIN) that made this process cost
    // more CPU than the daemon it measures. A link is read when its fd is
    // readable, when its last read stopped at the burst limit, and when a
    // send may have taken its bytes in (`Connection::may_hold_input`).
    let mut watch = WaitSet::new().map_err(BenchClusterError::caused("epoll"))?;
    for (i, link) in links.iter().enumerate() {
        if let Some(fd) = link.conn.wait_fd() {
            watch.add_keyed(fd, i as u64).map_err(BenchClusterError::caused("epoll"))?;
        }
    }
    let n = links.len();
    let mut b = Backends {
        control_delay: Duration::from_nanos(welcome.map_or(0, |w| w.control_delay_ns)),
        origin_host: clock.origin_host_ns(),
        gpus: GpuSet::new(total),
        stamps: vec![None; n],
        r: BackendsReport { gpus: total, ..Default::default() },
        lag: ns_hist(),
        buf: vec![0u8; wire::MAX_MESSAGE_LEN],
        unread: vec![true; n],
        touched: vec![true; n],
        polled: links.iter().map(|l| l.conn.wait_fd().is_none()).collect(),
        armed: vec![false; n],
        next_beat: Instant::ZERO,
        links,
        first_gpu,
        spec,
        a,
    };
    let mut ready = Vec::new();
    while !control::stop_requested() {
        let now = clock.now();
        ready.clear();
        watch.ready_now(&mut ready);
        for &k in &ready {
            if let Some(u) = b.unread.get_mut(k as usize) {
                *u = true;
            }
        }
        let mut busy = b.read_links(now)?;
        busy |= b.report_finished(now)?;
        b.heartbeats(now)?;
        if b.all_armed(busy) {
            // Sleep in epoll until a plan arrives, a batch finishes or a
            // heartbeat is due, instead of spinning on `yield`: this process
            // shares the 2 cores with the daemon it loads.
            let wake = b.gpus.poll_at().into_iter().chain([b.next_beat]).min();
            let now = clock.now();
            let budget = wake.map_or(IDLE_CAP, |t| t.saturating_since(now)).min(IDLE_CAP);
            watch.wait(budget);
        }
    }
    b.r.dispatch_lag = LagUs::of(&b.lag);
    b.r.cpu_busy = (peer::cpu_s_self() - cpu_at_start) / clock.now().saturating_since(began).as_secs_f64().max(1e-3);
    write_report(&b.a.report, &b.r)
}

/// The backends process's state between loop turns.
struct Backends<C> {
    links: Vec<peer::PeerLink<C>>,
    a: PeerArgs,
    spec: scheduler::zoo::ModelSpec,
    control_delay: Duration,
    origin_host: u64,
    /// The first GPU of each link in `gpus`.
    first_gpu: Vec<u32>,
    gpus: GpuSet<Tag>,
    /// Each link's stamp for the plan that follows it.
    stamps: Vec<Option<BenchStamp>>,
    r: BackendsReport,
    lag: hdrhistogram::Histogram<u64>,
    buf: Vec<u8>,
    /// Links to read this turn (fd readable, or the last read stopped at the burst limit).
    unread: Vec<bool>,
    /// Links sent on since their last read: a send may have taken their
    /// input in (`Connection::may_hold_input`). Only these are asked, not
    /// all 256 links twice per turn (the larger part of this process's
    /// user time).
    touched: Vec<bool>,
    /// Links without a wait fd: read every turn.
    polled: Vec<bool>,
    /// Links armed for a sleep (`Connection::arm_wait` said true) and
    /// neither read nor sent on since: still armed, so they need no new
    /// `arm_wait` before the next sleep. Why: arming all 256 links before
    /// every sleep (a fence and a shared cache line each) was a fifth of
    /// this process's CPU, while only the links just read need it.
    armed: Vec<bool>,
    /// The earliest heartbeat due over all links.
    next_beat: Instant,
}

impl<C: Connection> Backends<C> {
    /// Reads the links that may hold messages; whether any did.
    fn read_links(&mut self, now: Instant) -> Result<bool, BenchClusterError> {
        let mut busy = false;
        for i in 0..self.links.len() {
            if !(self.unread[i] || self.polled[i] || (self.touched[i] && self.links[i].conn.may_hold_input())) {
                self.touched[i] = false;
                continue;
            }
            self.unread[i] = false;
            self.touched[i] = false;
            self.armed[i] = false;
            for turn in 0..RECV_BURST {
                let n = match self.links[i].conn.try_recv(&mut self.buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) => return Err(BenchClusterError::caused(format!("backend {}: the scheduler link failed", self.links[i].id))(e)),
                };
                busy = true;
                self.unread[i] |= turn + 1 == RECV_BURST;
                self.on_message(i, n, now);
            }
        }
        Ok(busy)
    }

    /// The message of `n` bytes in `buf` from link `i`.
    fn on_message(&mut self, i: usize, n: usize, now: Instant) {
        let r = &mut self.r;
        match wire::decode(&self.buf[..n]) {
            Ok(Message::BenchStamp(s)) => self.stamps[i] = Some(s),
            Ok(Message::BatchPlan(head, tasks)) => {
                let received = host_monotonic_ns();
                r.plans += 1;
                r.tasks += tasks.len() as u64;
                let origin_host = self.origin_host;
                let local = |host_ns: u64| Instant::from_nanos(host_ns.saturating_sub(origin_host));
                // A plan that arrives after its planned start starts on arrival.
                let (start, deadline) = match self.stamps[i].take() {
                    Some(s) => {
                        let _ = self.lag.record(received.saturating_sub(s.at_ns).max(1));
                        if received > s.due_ns {
                            r.late_plans += 1;
                        }
                        (local(s.due_ns.max(received)), Some(local(s.deadline_ns)))
                    }
                    None => {
                        r.unstamped_plans += 1;
                        (now + Duration::from_nanos(head.exec_in_ns).saturating_sub(self.control_delay), None)
                    }
                };
                if head.gpu_id >= gpus_of(i as u32, self.a.peers, self.a.gpus) {
                    r.bad_messages += 1;
                    return;
                }
                let l = self.spec.profile.latency(tasks.len() as u32);
                let tag = (i as u32, head.batch_id, head.gpu_id, tasks.len() as u32);
                if let Ok(span) = self.gpus.submit(self.first_gpu[i] + head.gpu_id, start, l, tag) {
                    if deadline.is_some_and(|d| span.finish > d) {
                        r.late_tasks += tasks.len() as u64;
                    }
                }
            }
            Ok(_) => {}
            Err(_) => r.bad_messages += 1,
        }
    }

    /// Reports every batch finished by `now`; whether there was any.
    fn report_finished(&mut self, now: Instant) -> Result<bool, BenchClusterError> {
        let mut busy = false;
        while let Some(done) = self.gpus.pop_finished(now) {
            busy = true;
            let (i, batch_id, gpu_id, count) = done.tag;
            let d = BatchDone {
                batch_id,
                start_ago_ns: now.saturating_since(done.start).as_nanos(),
                finish_ago_ns: now.saturating_since(done.finish).as_nanos(),
                read_max_ns: 0,
                gpu_id,
                count,
                reads: 0,
                reserved: 0,
            };
            let n = wire::encode(&mut self.buf, &d)?;
            let link = &mut self.links[i as usize];
            self.touched[i as usize] = true;
            self.armed[i as usize] = false;
            match link.conn.send(&self.buf[..n]) {
                Ok(()) => self.r.batches_done += 1,
                // The scheduler fails back a batch whose report never came.
                Err(Error::QueueFull) => {}
                Err(e) => return Err(BenchClusterError::caused(format!("backend {}", link.id))(e)),
            }
        }
        Ok(busy)
    }

    /// Sends the heartbeats due by `now`.
    fn heartbeats(&mut self, now: Instant) -> Result<(), BenchClusterError> {
        if now < self.next_beat {
            return Ok(());
        }
        for (i, link) in self.links.iter_mut().enumerate() {
            if now >= link.live.next_send() {
                self.touched[i] = true;
                self.armed[i] = false;
                beat(link, now, Role::Backend, &mut self.buf).map_err(BenchClusterError::caused(format!("backend {}", link.id)))?;
            }
        }
        self.next_beat = self.links.iter().map(|l| l.live.next_send()).min().unwrap_or(Instant::NEVER);
        Ok(())
    }

    /// Whether the loop may sleep: not `busy`, no link holding input, and
    /// every link armed (arming those not armed yet).
    fn all_armed(&mut self, busy: bool) -> bool {
        // A send late in the turn may have taken a link's bytes in: its fd
        // is quiet then, so no sleep while any link holds input.
        let holds_input = self.links.iter().zip(&self.touched).any(|(l, &t)| t && l.conn.wait_fd().is_some() && l.conn.may_hold_input());
        // Arming (shm: the scheduler wakes us only if told we sleep) comes
        // last: a message that came meanwhile means no sleep, and its link
        // is read next turn (its fd may stay quiet: the message came
        // before the arming, so no wake-up byte follows it).
        let mut all_armed = !busy && !holds_input;
        if all_armed {
            for (i, link) in self.links.iter().enumerate() {
                if !self.armed[i] {
                    self.armed[i] = link.conn.arm_wait();
                    self.unread[i] |= !self.armed[i];
                    all_armed &= self.armed[i];
                }
            }
        }
        all_armed
    }
}
