//! The synthetic frontends of `symphony bench-cluster`: one process, many
//! registered frontend links (the real join handshake), one thread that
//! sends `Task`s open loop at their intended times (`sim::Arrivals`, dealt
//! round robin over the links) and counts the `Dropped`s that come back.
//! No HTTP, no staged inputs: the scheduler only routes the input
//! reference, and the synthetic backends never READ it.

use super::BenchClusterError;
use std::collections::VecDeque;
use std::io::Write as _;

use dataplane::time::{host_monotonic_ns, Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Error};
use dataplane::wire::{self, BenchStamp, DropReason, Message, RemoteRef, Role, Task, TaskBatcher, TaskId};
use hdrhistogram::Histogram;
use scheduler::sim::{Arrivals, Workload};
use scheduler::zoo::parse_model_arg;

use super::peer::{self, beat, join_all, ns_hist, write_report, LagUs, PeerArgs, PeerLink};

/// Arrivals sent per loop turn at most (receiving must not starve).
const SEND_BURST: usize = 4096;
/// Messages taken per link per loop turn at most.
const RECV_BURST: usize = 256;
/// The links are read (and heartbeats sent) at most this often. Why: the
/// scheduler only sends `Dropped`s and heartbeats this way, which are
/// counted, not answered; reading all 64 links on every loop turn was a
/// `recv` per link per turn (mostly EAGAIN), the larger part of this
/// process's CPU, taken from the daemon it loads on a 2-core machine.
const RECV_EVERY: Duration = Duration::from_millis(1);
/// Idle gaps shorter than this are spent in `yield` rather than a timed
/// sleep (a sleep costs two context switches and its timer).
const MIN_SLEEP: Duration = Duration::from_micros(20);
/// Unread messages remembered per link (see `Unread`).
const UNREAD_CAP: usize = 256;
/// Longest the links are driven after the load for what is still queued
/// to leave (the scheduler may be far behind: what it has not taken by
/// then is counted, `FrontendsReport::unsent_at_exit`).
const DRAIN_AT_EXIT: Duration = Duration::from_millis(500);

/// What the frontends process saw, written to its report file.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct FrontendsReport {
    /// Arrivals generated (offered).
    pub offered: u64,
    /// Tasks handed to a link.
    pub sent: u64,
    /// Tasks not sent: the link's send queue stayed full, or its oldest
    /// message not yet read by the scheduler had waited past
    /// `--queue-budget-us` (the queue is full in time: issue 14, item 2).
    pub queue_full: u64,
    /// Tasks not sent: the generator reached them more than `--max-lag-us`
    /// after their arrival (it is behind: refused, as a frontend refuses
    /// what it cannot submit while it is still worth scheduling).
    #[serde(default)]
    pub refused_late: u64,
    /// Of the tasks sent, at most this many had not left this process
    /// when the load ended and the links' drain bound ([`DRAIN_AT_EXIT`])
    /// passed: their messages were still queued in the link's stream or
    /// its socket's unsent bytes (`Connection::send_progress`) and go down
    /// with this process, the socket's perhaps not. An upper bound: what
    /// the scheduler counts received of them is not lost.
    #[serde(default)]
    pub unsent_at_exit: u64,
    /// `Dropped` received, by `DropReason::as_str`.
    pub dropped: Vec<(String, u64)>,
    /// Intended arrival -> handed to the link (the generator's own lag).
    /// Coalesced, each task counts its message's oldest task's lag (an
    /// upper bound; one histogram record per message, not per task).
    pub send_lag: LagUs,
    /// Seconds from the first intended arrival to the last send.
    pub send_span_s: f64,
    /// CPU time over wall time of the load (1.0 = one core busy).
    pub cpu_busy: f64,
}

pub fn run<D: Domain>(domain: D, a: PeerArgs) -> Result<(), BenchClusterError> {
    let spec = parse_model_arg(&format!("m={}", a.profile))?;
    let clock = MonotonicClock::new();
    let duration = Duration::from_secs_f64(a.duration_s);
    // Equal-rate Poisson models as one pooled stream (no per-arrival heap turn).
    let arrivals = Arrivals::pooled_for_model_count(a.models as usize, &Workload::poisson(a.rate), a.seed, duration);
    let arrivals = drawn_ahead(arrivals, a.rate * a.duration_s);
    let (links, _) = join_all(&domain, &a, Role::Frontend, &clock, |_| 0)?;
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "READY frontends={}", links.len());
        let _ = out.flush();
    }
    let start = clock.now() + Duration::from_millis(1);
    let cpu_at_start = peer::cpu_s_self();
    let mut arrivals = arrivals.with_origin(start);
    // Outcomes of the last tasks arrive within their SLO.
    let end = start + duration + spec.slo + Duration::from_millis(200);
    // Timed sleeps with the kernel timer's precision: 1 µs of slack
    // instead of the default 50 (a sleep of 20 µs must not last 70).
    // SAFETY: PR_SET_TIMERSLACK takes one integer and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    let coalesce = a.coalesce.max(1) as usize;
    let n = links.len();
    let mut g = Generator {
        seq: vec![0u64; n],
        dropped: [0u64; DropReason::COUNT],
        r: FrontendsReport::default(),
        send_lag: ns_hist(),
        buf: vec![0u8; wire::MAX_MESSAGE_LEN],
        next_link: 0,
        last_send: start,
        next_read: start,
        coalesce,
        coalesce_wait: Duration::from_micros(a.coalesce_us),
        // Past this lag an arrival is refused, not sent: an open-loop source
        // that falls behind would otherwise send only tasks whose budget is
        // spent, and the whole run collapses into drops (issue 14, item 2:
        // load beyond capacity is refused, counted, never buffered).
        max_lag: (a.max_lag_us > 0).then(|| Duration::from_micros(a.max_lag_us)),
        outgoing: if coalesce > 1 { (0..n).map(|_| Outgoing::new(coalesce)).collect() } else { Vec::new() },
        due: VecDeque::with_capacity(4 * n),
        queue_budget: (a.queue_budget_us > 0).then(|| Duration::from_micros(a.queue_budget_us)),
        unread: (0..n).map(|_| Unread::new()).collect(),
        slo: spec.slo,
        stamp_every: a.stamp_every,
        links,
    };
    loop {
        let now = clock.now();
        // More to do now: a burst limit was reached.
        let again = g.send_arrivals(&mut arrivals, now)?;
        g.flush_due(arrivals.peek().is_none(), now)?;
        g.read_links(now)?;
        if arrivals.peek().is_none() && now >= end {
            break;
        }
        if !again {
            g.idle(arrivals.peek().map(|(t, _)| t), &clock);
        }
    }
    let mut r = g.r;
    r.dropped = DropReason::ALL.iter().map(|d| (d.as_str().to_string(), g.dropped[d.index()])).collect();
    r.send_lag = LagUs::of(&g.send_lag);
    r.send_span_s = g.last_send.saturating_since(start).as_secs_f64();
    r.cpu_busy = (peer::cpu_s_self() - cpu_at_start) / clock.now().saturating_since(start).as_secs_f64().max(1e-3);
    r.unsent_at_exit = drain_at_exit(&mut g.links, &mut g.unread, &clock);
    write_report(&a.report, &r)?;
    linger(&mut g.links, &mut g.buf);
    Ok(())
}

/// The frontends process's load generator between loop turns.
struct Generator<C> {
    links: Vec<PeerLink<C>>,
    /// Each link's last task sequence number.
    seq: Vec<u64>,
    /// `Dropped` received, by `DropReason::index`.
    dropped: [u64; DropReason::COUNT],
    r: FrontendsReport,
    send_lag: Histogram<u64>,
    buf: Vec<u8>,
    /// The link the next arrival goes to (round robin).
    next_link: usize,
    last_send: Instant,
    next_read: Instant,
    /// Most tasks per message (1: one `Task` message each).
    coalesce: usize,
    coalesce_wait: Duration,
    max_lag: Option<Duration>,
    /// Each link's batch being filled (empty when not coalescing).
    outgoing: Vec<Outgoing>,
    /// Links with waiting tasks, in the order their oldest task arrived
    /// (= the order their batches are due): (link, that task's arrival).
    /// An entry whose batch left meanwhile is skipped when reached.
    due: VecDeque<(usize, Instant)>,
    queue_budget: Option<Duration>,
    unread: Vec<Unread>,
    slo: Duration,
    stamp_every: u64,
}

impl<C: Connection> Generator<C> {
    /// Sends (or batches, or refuses) the arrivals due by `now`, at most
    /// [`SEND_BURST`]; whether that limit left some due.
    fn send_arrivals(&mut self, arrivals: &mut Arrivals, now: Instant) -> Result<bool, BenchClusterError> {
        let mut burst = 0;
        while let Some((t, model)) = arrivals.peek() {
            if t > now {
                break;
            }
            if burst == SEND_BURST {
                return Ok(true);
            }
            arrivals.next();
            self.r.offered += 1;
            if self.max_lag.is_some_and(|m| now.saturating_since(t) > m) {
                // Cheap: no link, no id, no encoding; not a turn of the burst.
                self.r.refused_late += 1;
                continue;
            }
            burst += 1;
            self.send_one(t, model, now)?;
        }
        Ok(false)
    }

    /// The arrival at `t` for `model`, on the next link.
    fn send_one(&mut self, t: Instant, model: u32, now: Instant) -> Result<(), BenchClusterError> {
        let i = self.next_link;
        self.next_link = (self.next_link + 1) % self.links.len();
        let link = &mut self.links[i];
        self.seq[i] += 1;
        let task = Task {
            task_id: TaskId::new(link.id, self.seq[i] & dataplane::ids::SEQ_MASK, 0).0,
            budget_ns: (t + self.slo).saturating_since(now).as_nanos(),
            model_id: model,
            frontend_id: link.id,
            input: RemoteRef::default(),
            priority: 0,
            flags: 0,
        };
        let r = &mut self.r;
        let stamped = self.stamp_every > 0 && r.offered.is_multiple_of(self.stamp_every);
        if self.coalesce > 1 {
            let o = &mut self.outgoing[i];
            o.batch.push(&task)?;
            if o.oldest.is_none() {
                o.oldest = Some(t);
                self.due.push_back((i, t));
            }
            o.waiting += 1;
            o.stamp |= stamped;
            if o.batch.is_full() {
                o.flush(link, &mut self.unread[i], self.queue_budget, now, r, &mut self.send_lag, &mut self.buf)?;
                self.last_send = now;
            }
            return Ok(());
        }
        if self.unread[i].over_budget(&link.conn, self.queue_budget, now) {
            r.queue_full += 1;
            return Ok(());
        }
        let buf = &mut self.buf;
        if stamped {
            let s = BenchStamp { at_ns: host_monotonic_ns(), ..Default::default() };
            let n = wire::encode(buf, &s)?;
            send_or_progress(&mut link.conn, &buf[..n]).map_err(BenchClusterError::caused(format!("frontend {}", link.id)))?;
        }
        let n = wire::encode(buf, &task)?;
        match send_or_progress(&mut link.conn, &buf[..n]) {
            Ok(true) => {
                r.sent += 1;
                let _ = self.send_lag.record(now.saturating_since(t).as_nanos().max(1));
                self.last_send = now;
                self.unread[i].sent(&link.conn, 1, now);
            }
            Ok(false) => r.queue_full += 1,
            Err(e) => return Err(BenchClusterError::caused(format!("frontend {}", link.id))(e)),
        }
        Ok(())
    }

    /// Batches due go now (found in order, not by a pass over all links
    /// per turn), the last ones at once (`finishing`).
    fn flush_due(&mut self, finishing: bool, now: Instant) -> Result<(), BenchClusterError> {
        while let Some(&(i, t)) = self.due.front() {
            if !finishing && t + self.coalesce_wait > now {
                break;
            }
            self.due.pop_front();
            let o = &mut self.outgoing[i];
            if o.oldest == Some(t) {
                o.flush(&mut self.links[i], &mut self.unread[i], self.queue_budget, now, &mut self.r, &mut self.send_lag, &mut self.buf)?;
                self.last_send = now;
            }
        }
        Ok(())
    }

    /// Every [`RECV_EVERY`]: counts the `Dropped`s on every link and sends
    /// the heartbeats.
    fn read_links(&mut self, now: Instant) -> Result<(), BenchClusterError> {
        if now < self.next_read {
            return Ok(());
        }
        self.next_read = now + RECV_EVERY;
        for link in self.links.iter_mut() {
            for _ in 0..RECV_BURST {
                let n = match link.conn.try_recv(&mut self.buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) => return Err(BenchClusterError::caused(format!("frontend {}: the scheduler link failed", link.id))(e)),
                };
                if let Ok(Message::Dropped(d)) = wire::decode(&self.buf[..n]) {
                    if let Some(reason) = DropReason::from_u32(d.reason) {
                        self.dropped[reason.index()] += 1;
                    }
                }
            }
            beat(link, now, Role::Frontend, &mut self.buf).map_err(BenchClusterError::caused(format!("frontend {}", link.id)))?;
        }
        Ok(())
    }

    /// Sleeps until there is something to do instead of spinning on
    /// `yield` (a third of this process's CPU, taken from the daemon on 2
    /// cores): the next read, and the next batch due. Arrivals not taken
    /// yet (the next at `next_arrival`) wait too: batched, they would wait
    /// for their batch anyway, so the earliest an untaken arrival's batch
    /// can be due is its time plus the batch wait. Unbatched, each arrival
    /// is work.
    fn idle(&self, next_arrival: Option<Instant>, clock: &MonotonicClock) {
        let wait_for_batch = if self.coalesce > 1 { self.coalesce_wait } else { Duration::ZERO };
        let flush_due = self.due.front().map(|&(_, t)| t + self.coalesce_wait);
        let arrival_due = next_arrival.map(|t| t + wait_for_batch);
        // Timed sleeps (each a timer and two context switches) were
        // tried for shorter gaps too, with batches flushed up to 12 µs
        // early to serve many links per wake-up: on the shared 2 cores
        // that cost the frontends more CPU than the yields (0.25-0.35
        // vs 0.16 cores at 200k tasks/s) and the daemon its share.
        let work_at = [flush_due, arrival_due].into_iter().flatten().fold(self.next_read, Instant::min);
        let idle_for = work_at.saturating_since(clock.now());
        if idle_for >= MIN_SLEEP {
            sleep_for(idle_for);
        } else if idle_for > Duration::ZERO {
            std::thread::yield_now();
        }
    }
}

/// Drives every link until what it queued has left this process (or
/// [`DRAIN_AT_EXIT`] passes); returns how many sent tasks may not have.
fn drain_at_exit<C: Connection>(links: &mut [PeerLink<C>], unread: &mut [Unread], clock: &MonotonicClock) -> u64 {
    let until = clock.now() + DRAIN_AT_EXIT;
    let waiting = |c: &C| c.send_progress().is_some_and(|p| p.taken < p.accepted);
    loop {
        let mut any = false;
        for link in links.iter_mut() {
            if waiting(&link.conn) {
                // A gone scheduler leaves the bytes unsent: counted below.
                let _ = link.conn.progress();
                any |= waiting(&link.conn);
            }
        }
        if !any || clock.now() >= until {
            break;
        }
        std::thread::yield_now();
    }
    links.iter().zip(unread.iter_mut()).map(|(l, u)| u.unsent_tasks(&l.conn)).sum()
}

/// Longest the links stay open after the report (the runner stops this
/// process once the scheduler has settled).
const LINGER_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Keeps the links open and read until the runner says stop. Why: a socket
/// closed with input unread resets the connection (RFC 2525), and the
/// scheduler's socket then discards tasks it has received and not read
/// yet; a behind scheduler (a starved host) would lose them uncounted.
fn linger<C: Connection>(links: &mut [PeerLink<C>], buf: &mut [u8]) {
    let until = std::time::Instant::now() + LINGER_MAX;
    while !dataplane::control::stop_requested() && std::time::Instant::now() < until {
        let mut open = false;
        for link in links.iter_mut() {
            // Dropped and heartbeats, counted already or not at all.
            while let Ok(Some(_)) = link.conn.try_recv(buf) {}
            open |= link.conn.is_connected();
        }
        if !open {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Most arrivals drawn before the load starts (16 bytes each: 512 MiB);
/// a longer run draws them as it goes.
const DRAW_AHEAD_MAX: f64 = (1u64 << 25) as f64;

/// `arrivals` drawn whole into a trace before the load starts when about
/// `expected` of them fit under [`DRAW_AHEAD_MAX`], else as given. Why:
/// drawing each exponential gap and model as the load runs was a third of
/// this process's CPU at 2 M tasks/s, taken from the daemon it loads on the
/// shared cores; the trace is the same sequence, so the offered load is
/// unchanged and replaying it costs a load and an add per arrival.
fn drawn_ahead(arrivals: Arrivals, expected: f64) -> Arrivals {
    if !(expected.is_finite() && expected <= DRAW_AHEAD_MAX) {
        return arrivals;
    }
    // Poisson counts exceed their mean by a few standard deviations at most.
    let room = expected + 6.0 * expected.sqrt() + 64.0;
    let mut trace = Vec::with_capacity(room as usize);
    trace.extend(arrivals);
    Arrivals::trace(trace)
}

/// A link's tasks waiting to go as one `Tasks` message.
struct Outgoing {
    batch: TaskBatcher,
    /// Intended arrival of the oldest waiting task.
    oldest: Option<Instant>,
    /// Tasks waiting.
    waiting: u64,
    /// A waiting task is to be stamped: a stamp precedes the message.
    stamp: bool,
}

impl Outgoing {
    fn new(limit: usize) -> Self {
        Outgoing { batch: TaskBatcher::new(limit), oldest: None, waiting: 0, stamp: false }
    }

    /// Sends the waiting tasks as one message (preceded by a stamp when one
    /// of them is stamped), or counts them refused when the link's queue
    /// stays full or is over its time budget.
    #[allow(clippy::too_many_arguments)]
    fn flush<C: Connection>(
        &mut self,
        link: &mut PeerLink<C>,
        unread: &mut Unread,
        budget: Option<Duration>,
        now: Instant,
        r: &mut FrontendsReport,
        lag: &mut Histogram<u64>,
        buf: &mut [u8],
    ) -> Result<(), BenchClusterError> {
        let fail = |e: Error| BenchClusterError::caused(format!("frontend {}", link.id))(e);
        if unread.over_budget(&link.conn, budget, now) {
            self.stamp = false;
            self.oldest = None;
            r.queue_full += std::mem::take(&mut self.waiting);
            let _ = self.batch.take();
            return Ok(());
        }
        if std::mem::take(&mut self.stamp) {
            let s = BenchStamp { at_ns: host_monotonic_ns(), ..Default::default() };
            let n = wire::encode(buf, &s)?;
            // Queued, not sent: it leaves with the batch below in one write
            // (one system call over tcp instead of two; a full queue skips
            // the stamp, as a full queue skipped it before).
            match link.conn.send_batched(&buf[..n]) {
                Ok(()) | Err(Error::QueueFull) => {}
                Err(e) => return Err(fail(e)),
            }
        }
        let Some(msg) = self.batch.take() else { return Ok(()) };
        let n = std::mem::take(&mut self.waiting);
        let oldest = self.oldest.take();
        if send_or_progress(&mut link.conn, msg).map_err(fail)? {
            unread.sent(&link.conn, n, now);
            r.sent += n;
            if let Some(t) = oldest {
                let _ = lag.record_n(now.saturating_since(t).as_nanos().max(1), n);
            }
        } else {
            r.queue_full += n;
        }
        Ok(())
    }
}

/// Messages a link sent that the scheduler has not read yet, oldest first:
/// (the link's accepted byte count once the message was queued, when, the
/// link's tasks queued so far then), and how fast the scheduler reads the
/// link when it is behind. From the
/// link's `send_progress` this tells how long a new message would wait:
/// past the budget the link refuses instead of queueing (issue 14, item
/// 2: a ring and a send queue in front of a saturated scheduler held
/// ~260 ms).
struct Unread {
    ends: VecDeque<(u64, Instant, u64)>,
    /// Tasks queued on the link so far.
    tasks: u64,
    /// Of those, tasks whose messages have left (as far as `ends` tells).
    tasks_left: u64,
    /// Start of the current drain-rate window: (taken, unread, when).
    window: (u64, u64, Instant),
    /// Bytes per ns the scheduler takes off this link while behind it;
    /// `None` until measured.
    drain: Option<f64>,
}

/// Length of a drain-rate measurement window.
const DRAIN_WINDOW: Duration = Duration::from_micros(500);

impl Unread {
    fn new() -> Self {
        Unread { ends: VecDeque::with_capacity(UNREAD_CAP), tasks: 0, tasks_left: 0, window: (0, 0, Instant::ZERO), drain: None }
    }

    /// Whether a message queued now would wait past `budget` (never,
    /// without a budget or where the transport cannot tell): the oldest
    /// unread one already has, or the bytes ahead of it take longer than
    /// the budget at the rate the scheduler drained this link lately. Why
    /// both: the age alone bounds what is queued to a budget's worth of
    /// the *offered* rate, which a scheduler draining ten times slower
    /// takes ten budgets to read.
    fn over_budget<C: Connection>(&mut self, conn: &C, budget: Option<Duration>, now: Instant) -> bool {
        let Some(budget) = budget else { return false };
        let Some(p) = conn.send_progress() else { return false };
        self.forget_taken(p.taken);
        let unread = p.accepted - p.taken;
        let (taken0, unread0, at0) = self.window;
        let span = now.saturating_since(at0);
        if span >= DRAIN_WINDOW {
            let rate = (p.taken - taken0) as f64 / span.as_nanos() as f64;
            if unread0 > 0 && unread > 0 {
                // Behind the whole window: the scheduler's pace on this link.
                self.drain = Some(self.drain.map_or(rate, |d| 0.5 * d + 0.5 * rate));
            } else if unread0 > 0 {
                // It caught up: at least this fast.
                self.drain = Some(self.drain.map_or(rate, |d| d.max(rate)));
            }
            self.window = (p.taken, unread, now);
        }
        if self.ends.front().is_some_and(|&(_, at, _)| now.saturating_since(at) > budget) {
            return true;
        }
        unread > 0 && self.drain.is_some_and(|d| unread as f64 > d * budget.as_nanos() as f64)
    }

    /// Forgets the messages that have left (`taken` bytes have).
    fn forget_taken(&mut self, taken: u64) {
        while let Some(&(end, _, tasks)) = self.ends.front() {
            if end > taken {
                break;
            }
            self.tasks_left = tasks;
            self.ends.pop_front();
        }
    }

    /// Notes a message of `tasks` tasks just queued on the link.
    fn sent<C: Connection>(&mut self, conn: &C, tasks: u64, now: Instant) {
        self.tasks += tasks;
        let Some(accepted) = conn.accepted_bytes() else { return };
        if self.ends.len() == UNREAD_CAP {
            // Full (no allocation): the newest entry absorbs this message,
            // keeping its older time (the wait is overstated, never under).
            if let Some(back) = self.ends.back_mut() {
                back.0 = accepted;
                back.2 = self.tasks;
            }
        } else {
            self.ends.push_back((accepted, now, self.tasks));
        }
    }

    /// Tasks queued whose messages have not all left the link (an upper
    /// bound where full `ends` merged messages); 0 where the transport
    /// cannot tell.
    fn unsent_tasks<C: Connection>(&mut self, conn: &C) -> u64 {
        let Some(p) = conn.send_progress() else { return 0 };
        self.forget_taken(p.taken);
        self.tasks - self.tasks_left
    }
}

/// One `clock_nanosleep` (a timerfd and epoll, as `WaitSet::wait`, is
/// two system calls per wake-up, and this loop wakes up to 50k times a
/// second).
fn sleep_for(d: Duration) {
    let ns = d.as_nanos();
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    // SAFETY: a valid timespec; no remainder is asked for (an interrupted
    // sleep ends early, and the loop computes its next sleep anew).
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, std::ptr::null_mut()) };
}

/// Sends `msg`; a full queue gets one round of progress before the message
/// is given up (`Ok(false)`): an open-loop source never blocks. Why not
/// more: the scheduler does not drain a full queue within nanoseconds, and
/// each retry on a full shm ring was a pass through the stream (a third of
/// this process's CPU in overload).
fn send_or_progress<C: Connection>(conn: &mut C, msg: &[u8]) -> Result<bool, Error> {
    for _ in 0..2 {
        match conn.send(msg) {
            Ok(()) => return Ok(true),
            Err(Error::QueueFull) => conn.progress()?,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::transport::{Completion, ReadOp, SendProgress};

    /// A link whose send progress the test sets: `accepted` grows with each
    /// message queued, `taken` as the test says the scheduler read.
    struct Link(SendProgress);

    impl Connection for Link {
        fn send(&mut self, msg: &[u8]) -> Result<(), Error> {
            self.0.accepted += msg.len() as u64;
            Ok(())
        }
        fn try_recv(&mut self, _: &mut [u8]) -> Result<Option<usize>, Error> {
            Ok(None)
        }
        fn post_read(&mut self, _: &ReadOp) -> Result<(), Error> {
            Ok(())
        }
        fn poll_completions(&mut self, _: &mut [Completion]) -> Result<usize, Error> {
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
        fn send_progress(&self) -> Option<SendProgress> {
            Some(self.0)
        }
    }

    fn at(us: u64) -> Instant {
        Instant::from_nanos(1_000_000_000 + us * 1000)
    }

    const BUDGET: Option<Duration> = Some(Duration::from_micros(5_000));

    /// Queues one 100-byte message of one task at `now`.
    fn queue(link: &mut Link, u: &mut Unread, now: Instant) {
        link.send(&[0; 100]).unwrap();
        u.sent(link, 1, now);
    }

    #[test]
    fn a_link_read_in_time_never_refuses() {
        let (mut link, mut u) = (Link(SendProgress { accepted: 0, taken: 0 }), Unread::new());
        for i in 0..1_000 {
            let now = at(i * 100);
            assert!(!u.over_budget(&link, BUDGET, now), "message {i}");
            queue(&mut link, &mut u, now);
            // Read 50 µs later, well within the budget.
            link.0.taken = link.0.accepted;
        }
        assert_eq!(u.unsent_tasks(&link), 0);
    }

    #[test]
    fn refuses_once_the_oldest_unread_message_is_older_than_the_budget() {
        let (mut link, mut u) = (Link(SendProgress { accepted: 0, taken: 0 }), Unread::new());
        queue(&mut link, &mut u, at(0));
        assert!(!u.over_budget(&link, BUDGET, at(5_000)), "at the budget, not past it");
        assert!(u.over_budget(&link, BUDGET, at(5_001)));
        assert_eq!(u.unsent_tasks(&link), 1);
        // The scheduler reads it: accepted again.
        link.0.taken = link.0.accepted;
        assert!(!u.over_budget(&link, BUDGET, at(5_002)));
        assert_eq!(u.unsent_tasks(&link), 0);
    }

    #[test]
    fn refuses_what_a_slow_drain_would_hold_past_the_budget() {
        // Offered: a 100-byte message every 10 µs (10 bytes/µs); the
        // scheduler reads 1 byte/µs. Every message is younger than the
        // budget when the refusals start: the drain rate tells first.
        let (mut link, mut u) = (Link(SendProgress { accepted: 0, taken: 0 }), Unread::new());
        let mut first_refusal = None;
        for i in 0..2_000u64 {
            let now = at(i * 10);
            link.0.taken = (i * 10).min(link.0.accepted);
            if u.over_budget(&link, BUDGET, now) {
                first_refusal.get_or_insert(i * 10);
                continue;
            }
            queue(&mut link, &mut u, now);
        }
        let first = first_refusal.expect("a link drained 10x slower than fed refuses");
        assert!(first < 5_000, "refused at {first} µs, before any message aged past the budget");
        // What it let queue drains within about a budget at the measured rate.
        let unread = link.0.accepted - link.0.taken;
        assert!(unread <= 5_000 + 200, "{unread} bytes unread at 1 byte/µs");
    }

    #[test]
    fn no_budget_or_no_progress_never_refuses() {
        let (mut link, mut u) = (Link(SendProgress { accepted: 0, taken: 0 }), Unread::new());
        queue(&mut link, &mut u, at(0));
        assert!(!u.over_budget(&link, None, at(1_000_000)));
    }
}
