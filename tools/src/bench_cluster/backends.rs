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
    let spec = parse_model_arg(&format!("m={}", a.profile)).map_err(|e| BenchClusterError::Peer(e.to_string()))?;
    let clock = MonotonicClock::new();
    let (mut links, welcome) = join_all(&domain, &a, Role::Backend, &clock, |i| gpus_of(i, a.peers, a.gpus))?;
    let control_delay = Duration::from_nanos(welcome.map_or(0, |w| w.control_delay_ns));
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
    let origin_host = clock.origin_host_ns();
    let mut gpus: GpuSet<Tag> = GpuSet::new(total);
    let mut stamps: Vec<Option<BenchStamp>> = vec![None; links.len()];
    let mut r = BackendsReport { gpus: total, ..Default::default() };
    let mut lag = ns_hist();
    let (began, cpu_at_start) = (clock.now(), peer::cpu_s_self());
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    // Which links have bytes: one epoll_wait per turn instead of a `recv`
    // per link (256 of them, mostly EAGAIN) that made this process cost
    // more CPU than the daemon it measures. A link is read when its fd is
    // readable, when its last read stopped at the burst limit, and when a
    // send may have taken its bytes in (`Connection::may_hold_input`).
    let mut watch = WaitSet::new().map_err(|e| BenchClusterError::Peer(format!("epoll: {e}")))?;
    for (i, link) in links.iter().enumerate() {
        if let Some(fd) = link.conn.wait_fd() {
            watch.add_keyed(fd, i as u64).map_err(|e| BenchClusterError::Peer(format!("epoll: {e}")))?;
        }
    }
    let mut unread: Vec<bool> = vec![true; links.len()];
    // Links sent on since their last read: a send may have taken their
    // input in (`Connection::may_hold_input`). Only these are asked, not
    // all 256 links twice per turn (the larger part of this process's
    // user time).
    let mut touched: Vec<bool> = vec![true; links.len()];
    let polled: Vec<bool> = links.iter().map(|l| l.conn.wait_fd().is_none()).collect();
    // Links armed for a sleep (`Connection::arm_wait` said true) and
    // neither read nor sent on since: still armed, so they need no new
    // `arm_wait` before the next sleep. Why: arming all 256 links before
    // every sleep (a fence and a shared cache line each) was a fifth of
    // this process's CPU, while only the links just read need it.
    let mut armed: Vec<bool> = vec![false; links.len()];
    // The earliest heartbeat due over all links.
    let mut next_beat = Instant::ZERO;
    let mut ready = Vec::new();
    while !control::stop_requested() {
        let now = clock.now();
        let mut busy = false;
        ready.clear();
        watch.ready_now(&mut ready);
        for &k in &ready {
            if let Some(u) = unread.get_mut(k as usize) {
                *u = true;
            }
        }
        for (i, link) in links.iter_mut().enumerate() {
            if !(unread[i] || polled[i] || (touched[i] && link.conn.may_hold_input())) {
                touched[i] = false;
                continue;
            }
            unread[i] = false;
            touched[i] = false;
            armed[i] = false;
            for turn in 0..RECV_BURST {
                let n = match link.conn.try_recv(&mut buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) => return Err(BenchClusterError::Peer(format!("backend {}: the scheduler link failed: {e}", link.id))),
                };
                busy = true;
                unread[i] |= turn + 1 == RECV_BURST;
                match wire::decode(&buf[..n]) {
                    Ok(Message::BenchStamp(s)) => stamps[i] = Some(s),
                    Ok(Message::BatchPlan(head, tasks)) => {
                        let received = host_monotonic_ns();
                        r.plans += 1;
                        r.tasks += tasks.len() as u64;
                        let local = |host_ns: u64| Instant::from_nanos(host_ns.saturating_sub(origin_host));
                        // A plan that arrives after its planned start starts on arrival.
                        let (start, deadline) = match stamps[i].take() {
                            Some(s) => {
                                let _ = lag.record(received.saturating_sub(s.at_ns).max(1));
                                if received > s.due_ns {
                                    r.late_plans += 1;
                                }
                                (local(s.due_ns.max(received)), Some(local(s.deadline_ns)))
                            }
                            None => {
                                r.unstamped_plans += 1;
                                (now + Duration::from_nanos(head.exec_in_ns).saturating_sub(control_delay), None)
                            }
                        };
                        if head.gpu_id >= gpus_of(i as u32, a.peers, a.gpus) {
                            r.bad_messages += 1;
                            continue;
                        }
                        let l = spec.profile.latency(tasks.len() as u32);
                        let tag = (i as u32, head.batch_id, head.gpu_id, tasks.len() as u32);
                        if let Ok(span) = gpus.submit(first_gpu[i] + head.gpu_id, start, l, tag) {
                            if deadline.is_some_and(|d| span.finish > d) {
                                r.late_tasks += tasks.len() as u64;
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(_) => r.bad_messages += 1,
                }
            }
        }
        while let Some(done) = gpus.pop_finished(now) {
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
            let n = wire::encode(&mut buf, &d).map_err(|e| BenchClusterError::Peer(e.to_string()))?;
            let link = &mut links[i as usize];
            touched[i as usize] = true;
            armed[i as usize] = false;
            match link.conn.send(&buf[..n]) {
                Ok(()) => r.batches_done += 1,
                // The scheduler fails back a batch whose report never came.
                Err(Error::QueueFull) => {}
                Err(e) => return Err(BenchClusterError::Peer(format!("backend {}: {e}", link.id))),
            }
        }
        if now >= next_beat {
            for (i, link) in links.iter_mut().enumerate() {
                if now >= link.live.next_send() {
                    touched[i] = true;
                    armed[i] = false;
                    beat(link, now, Role::Backend, &mut buf).map_err(|e| BenchClusterError::Peer(format!("backend {}: {e}", link.id)))?;
                }
            }
            next_beat = links.iter().map(|l| l.live.next_send()).min().unwrap_or(Instant::NEVER);
        }
        // A send late in the turn may have taken a link's bytes in: its fd
        // is quiet then, so no sleep while any link holds input.
        let holds_input = links.iter().zip(&touched).any(|(l, &t)| t && l.conn.wait_fd().is_some() && l.conn.may_hold_input());
        // Arming (shm: the scheduler wakes us only if told we sleep) comes
        // last: a message that came meanwhile means no sleep, and its link
        // is read next turn (its fd may stay quiet: the message came
        // before the arming, so no wake-up byte follows it).
        let mut all_armed = !busy && !holds_input;
        if all_armed {
            for (i, link) in links.iter().enumerate() {
                if !armed[i] {
                    armed[i] = link.conn.arm_wait();
                    unread[i] |= !armed[i];
                    all_armed &= armed[i];
                }
            }
        }
        if all_armed {
            // Sleep in epoll until a plan arrives, a batch finishes or a
            // heartbeat is due, instead of spinning on `yield`: this process
            // shares the 2 cores with the daemon it loads.
            let wake = gpus.poll_at().into_iter().chain([next_beat]).min();
            let now = clock.now();
            let budget = wake.map_or(IDLE_CAP, |t| t.saturating_since(now)).min(IDLE_CAP);
            watch.wait(budget);
        }
    }
    r.dispatch_lag = LagUs::of(&lag);
    r.cpu_busy = (peer::cpu_s_self() - cpu_at_start) / clock.now().saturating_since(began).as_secs_f64().max(1e-3);
    write_report(&a.report, &r)
}
