//! The harness's open-loop client: requests leave at their intended times
//! (the simulator's arrival generator), so queueing inside the cluster
//! cannot slow the offered load down (no coordinated omission), and every
//! request is followed to exactly one end.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use dataplane::reference::expected_output;
use dataplane::time::{Duration, Instant};
use frontend::models::ModelCatalog;
use frontend::node::NetSink;
use frontend::service::{ClusterService, InferenceService, SubmitError};
use frontend::staging::{CounterSnapshot, Outcome, RequestOptions, Ticket};
use scheduler::sim::{Arrivals, Workload};

use super::{ChaosConfig, ChaosReport};

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The right output, by its deadline.
    OnTime,
    /// The right output, after its deadline.
    Late,
    /// Dropped by the scheduler (reason).
    Dropped(&'static str),
    /// Failed (reason).
    Failed(String),
    /// The client cancelled it before an outcome came.
    Cancelled,
}

struct Request {
    model: u32,
    deadline: Instant,
    frontend: usize,
    end: Option<End>,
    /// Ends seen after the first (must stay 0).
    extra_ends: u32,
}

struct Open {
    request: usize,
    ticket: Ticket,
    give_up_at: Instant,
    /// When the client gives it up on purpose (a cancel), if it does.
    cancel_at: Option<Instant>,
}

/// What the client saw from one frontend incarnation (compared with that
/// frontend's own counters at the end).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Accepted (staged) by the frontend.
    pub accepted: u64,
    /// Answered with an output.
    pub succeeded: u64,
    /// Dropped.
    pub dropped: u64,
    /// Failed or timed out.
    pub failed: u64,
    /// Cancelled by the client.
    pub cancelled: u64,
}

/// The open-loop client.
pub struct Client {
    arrivals: Arrivals,
    slos: Vec<Duration>,
    input_len: Vec<usize>,
    output_len: Vec<usize>,
    requests: Vec<Request>,
    open: Vec<Open>,
    next_frontend: usize,
    tallies: Vec<Tally>,
    input: Vec<u8>,
    expected: Vec<u8>,
    /// Wrong outputs seen.
    pub wrong_outputs: u64,
    seed: u64,
    priority_mix: f64,
    cancel_share: f64,
    /// Cancels that came too late (the outcome was already there).
    pub cancels_too_late: u64,
}

/// A uniform draw in [0, 1) from `(seed, i, stream)`, independent of the
/// arrival generator (so a run without priorities or cancels is exactly
/// what it was before they existed).
fn unit(seed: u64, i: u64, stream: u64) -> f64 {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl Client {
    /// A client for `cfg`'s workload; arrival times are offset by `origin`.
    pub fn new(cfg: &ChaosConfig, catalog: Arc<ModelCatalog>, origin: Instant) -> Self {
        let workload = Workload::poisson(cfg.rate_rps);
        let arrivals = Arrivals::generated(&cfg.models, &workload, cfg.seed, cfg.duration).with_origin(origin);
        Client {
            arrivals,
            slos: cfg.models.iter().map(|m| m.slo).collect(),
            input_len: catalog.entries().iter().map(|e| e.input.byte_len() as usize).collect(),
            output_len: catalog.entries().iter().map(|e| e.output.byte_len() as usize).collect(),
            requests: Vec::new(),
            open: Vec::new(),
            next_frontend: 0,
            tallies: vec![Tally::default(); cfg.frontends],
            input: Vec::new(),
            expected: Vec::new(),
            wrong_outputs: 0,
            seed: cfg.seed,
            priority_mix: cfg.priority_mix,
            cancel_share: cfg.cancel_share,
            cancels_too_late: 0,
        }
    }

    /// When the client next has something to do: an arrival or a give-up.
    pub fn next_at(&self) -> Option<Instant> {
        let a = self.arrivals.peek_time();
        let g = self.open.iter().map(|o| o.cancel_at.map_or(o.give_up_at, |c| c.min(o.give_up_at))).min();
        [a, g].into_iter().flatten().min()
    }

    fn end(&mut self, i: usize, e: End) {
        let r = &mut self.requests[i];
        if r.end.is_some() {
            r.extra_ends += 1;
            return;
        }
        let t = &mut self.tallies[r.frontend];
        match &e {
            End::OnTime | End::Late => t.succeeded += 1,
            End::Dropped(_) => t.dropped += 1,
            End::Cancelled => t.cancelled += 1,
            // Never reached the frontend's counters, or died with it.
            End::Failed(why) if why == "frontend_lost" || why == "no_frontend" || why.starts_with("refused") => {}
            End::Failed(_) => t.failed += 1,
        }
        r.end = Some(e);
    }

    /// Sends every request due by `now` through a live frontend (round
    /// robin, like a load balancer). Returns whether any was sent.
    pub fn send_due(&mut self, now: Instant, frontends: &[Option<&ClusterService<NetSink>>]) -> bool {
        let mut any = false;
        while self.arrivals.peek_time().is_some_and(|t| t <= now) {
            let Some((intended, model)) = self.arrivals.next() else { break };
            let slo = self.slos.get(model as usize).copied().unwrap_or(Duration::ZERO);
            let idx = self.requests.len();
            let live: Vec<usize> = (0..frontends.len()).filter(|&i| frontends[i].is_some()).collect();
            let fe = if live.is_empty() { 0 } else { live[self.next_frontend % live.len()] };
            self.next_frontend = self.next_frontend.wrapping_add(1);
            self.requests.push(Request { model, deadline: intended + slo, frontend: fe, end: None, extra_ends: 0 });
            any = true;
            let Some(service) = frontends.get(fe).copied().flatten() else {
                self.end(idx, End::Failed("no_frontend".into()));
                continue;
            };
            fill_input(&mut self.input, idx as u64, self.input_len.get(model as usize).copied().unwrap_or(0));
            // Open loop: the budget runs from the intended send time.
            let budget = (intended + slo).saturating_since(now);
            let priority = if self.priority_mix > 0.0 && unit(self.seed, idx as u64, 1) >= self.priority_mix { 2 } else { 1 };
            let cancel_at = (self.cancel_share > 0.0 && unit(self.seed, idx as u64, 2) < self.cancel_share)
                .then(|| now + Duration::from_nanos((unit(self.seed, idx as u64, 3) * budget.as_nanos() as f64) as u64));
            let priority = if self.priority_mix > 0.0 { priority } else { 0 };
            let submitted = service.submit(model, &self.input, budget, RequestOptions { priority, timeout: None });
            match submitted {
                Ok(ticket) => {
                    self.tallies[fe].accepted += 1;
                    let give_up_at = now + budget.saturating_add(service.grace());
                    self.open.push(Open { request: idx, ticket, give_up_at, cancel_at });
                }
                Err(SubmitError::SendFailed(_)) => {
                    // Staged, then failed at once: the frontend counts it.
                    self.tallies[fe].accepted += 1;
                    self.end(idx, End::Failed("send_failed".into()));
                }
                Err(e) => {
                    let why = match e {
                        SubmitError::Unavailable(_) => "refused_unavailable",
                        SubmitError::UnknownModel => "refused_unknown_model",
                        SubmitError::BadInput(_) => "refused_bad_input",
                        _ => "refused_internal",
                    };
                    self.end(idx, End::Failed(why.into()));
                }
            }
        }
        any
    }

    /// Cancels every open request whose cancel time has come, through its
    /// frontend (`NetSink::cancel`).
    /// Returns whether any was cancelled.
    pub fn cancel_due(&mut self, now: Instant, frontends: &[Option<&ClusterService<NetSink>>]) -> bool {
        let mut any = false;
        for o in &mut self.open {
            if o.cancel_at.is_none_or(|t| t > now) {
                continue;
            }
            o.cancel_at = None;
            let fe = self.requests[o.request].frontend;
            let Some(service) = frontends.get(fe).copied().flatten() else { continue };
            if service.sink().cancel(&mut o.ticket) {
                any = true;
            } else {
                self.cancels_too_late += 1;
            }
        }
        any
    }

    /// Takes every outcome that has arrived and gives up on requests whose
    /// budget plus grace has passed (as the HTTP layer does).
    pub fn collect(&mut self, now: Instant) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut i = 0;
        while i < self.open.len() {
            let o = &mut self.open[i];
            let outcome = match Pin::new(&mut o.ticket).poll(&mut cx) {
                Poll::Ready(out) => Some(out),
                Poll::Pending if o.give_up_at <= now => Some(o.ticket.expire()),
                Poll::Pending => None,
            };
            let Some(outcome) = outcome else {
                i += 1;
                continue;
            };
            let o = self.open.swap_remove(i);
            let r = o.request;
            let e = self.classify(r, now, outcome);
            self.end(r, e);
        }
    }

    fn classify(&mut self, r: usize, now: Instant, outcome: Outcome) -> End {
        let model = self.requests[r].model;
        match outcome {
            Outcome::Ok(bytes) => {
                fill_input(&mut self.input, r as u64, self.input_len.get(model as usize).copied().unwrap_or(0));
                self.expected.resize(self.output_len.get(model as usize).copied().unwrap_or(0), 0);
                expected_output(model, &self.input, &mut self.expected);
                if bytes != self.expected {
                    self.wrong_outputs += 1;
                }
                if now <= self.requests[r].deadline {
                    End::OnTime
                } else {
                    End::Late
                }
            }
            Outcome::Dropped(dataplane::wire::DropReason::Cancelled) => End::Cancelled,
            Outcome::Dropped(reason) => End::Dropped(reason.as_str()),
            Outcome::Failed(status) => End::Failed(format!("{status:?}").to_lowercase()),
            Outcome::TimedOut => End::Failed("timed_out".into()),
        }
    }

    /// Frontend `i` crashed: every request still open on it ends as
    /// `frontend_lost`, and its tally starts over with its next
    /// incarnation (whose counters start at zero). Returns how many ended.
    pub fn frontend_lost(&mut self, fe: usize) -> u64 {
        let mut lost = 0;
        let mut i = 0;
        while i < self.open.len() {
            if self.requests[self.open[i].request].frontend == fe {
                let o = self.open.swap_remove(i);
                self.end(o.request, End::Failed("frontend_lost".into()));
                lost += 1;
            } else {
                i += 1;
            }
        }
        if let Some(t) = self.tallies.get_mut(fe) {
            *t = Tally::default();
        }
        lost
    }

    /// The tally of frontend slot `i`'s current incarnation.
    pub fn tally(&self, i: usize) -> Tally {
        self.tallies.get(i).copied().unwrap_or_default()
    }

    /// Requests that ended more than once.
    pub fn ended_twice(&self) -> u64 {
        self.requests.iter().map(|r| u64::from(r.extra_ends)).sum()
    }

    /// Requests not ended yet.
    pub fn unended(&self) -> u64 {
        self.requests.iter().filter(|r| r.end.is_none()).count() as u64
    }

    /// Fills the report's outcome counts.
    pub fn fill(&self, rep: &mut ChaosReport) {
        rep.accepted = self.requests.len() as u64;
        for r in &self.requests {
            match &r.end {
                Some(End::OnTime) => rep.succeeded += 1,
                Some(End::Late) => rep.late += 1,
                Some(End::Dropped(why)) => *rep.dropped.entry((*why).to_string()).or_insert(0) += 1,
                Some(End::Failed(why)) => *rep.failed.entry(why.clone()).or_insert(0) += 1,
                Some(End::Cancelled) => rep.cancelled += 1,
                None => rep.unaccounted += 1,
            }
        }
    }
}

/// Request `i`'s input: distinct per request, so a crossed output shows.
fn fill_input(buf: &mut Vec<u8>, i: u64, len: usize) {
    buf.clear();
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while buf.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes());
    }
    buf.truncate(len);
}

/// Compares each frontend's own counters with the client's tally of it.
pub fn counter_mismatches(counters: &[(usize, CounterSnapshot)], client: &Client) -> Vec<String> {
    let mut v = Vec::new();
    for &(i, c) in counters {
        let t = client.tally(i);
        let mine = Tally { accepted: c.accepted, succeeded: c.succeeded, dropped: c.dropped, failed: c.failed, cancelled: c.cancelled };
        if mine != t {
            v.push(format!("frontend slot {i}: its counters {mine:?} differ from what the client saw {t:?}"));
        }
    }
    v
}
