//! The invariants checked after every harness run.

use std::collections::{BTreeMap, HashMap};

use dataplane::time::Instant;
use dataplane::transport::sim::{NodeId, Traffic};
use dataplane::wire::{self, Message, TaskStatus};
use frontend::staging::CounterSnapshot;

use super::client::{counter_mismatches, Client};

/// What the network tap saw of the backends' work.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Successful completions sent by backends, by task id (counted at the
    /// send, before the network can duplicate them).
    pub executed: HashMap<u64, u32>,
    /// Tasks of the plans each backend received, with the plan's epoch.
    pub planned: HashMap<NodeId, HashMap<u64, u32>>,
    /// Tasks each backend sent a completion for (to anyone).
    pub answered: HashMap<NodeId, std::collections::HashSet<u64>>,
    /// Scheduler nodes are the network ids below this (at least node 0).
    pub schedulers: NodeId,
    /// Per epoch, the first and the last plan a scheduler of the elected
    /// group (a) sent. Group b's scheduler (`reroute2`) stands outside that
    /// election: its fixed term is no rival of group a's terms.
    pub plan_times: BTreeMap<u32, (Instant, Instant)>,
    /// Backends group b's scheduler planned onto (their batches are of
    /// group b's term, not of group a's).
    pub group_b_backends: std::collections::HashSet<NodeId>,
    /// Per node, each newer epoch it was delivered (Welcome or plan), when.
    pub epochs_seen: HashMap<NodeId, Vec<(Instant, u32)>>,
    /// With routing tables: per scheduler node (of either group; a new
    /// term is a new node), per model, whether that node has applied a
    /// routing revision that took the model away (set by the harness right
    /// after the node applied it).
    pub moved_away: HashMap<NodeId, Vec<bool>>,
    /// With two groups (`reroute2`): group b's scheduler node.
    pub group_b: Option<NodeId>,
    /// Plans of a model a scheduler sent after it had applied a revision
    /// that took the model away (must be empty).
    pub unowned_plans: Vec<String>,
    /// A task whose every message to note (`symphony chaos --trace-task`).
    pub trace_task: Option<u64>,
    /// The traced task's messages, in order.
    pub trace: Vec<String>,
}

impl Ledger {
    /// Takes one message the network carried.
    pub fn observe(&mut self, t: Traffic<'_>) {
        if self.trace_task.is_some() {
            self.trace_message(&t);
        }
        let from_b = self.group_b == Some(t.from);
        let from_scheduler = t.from < self.schedulers.max(1) || from_b;
        match (t.delivered, wire::decode(t.bytes)) {
            // Only backends receive plans.
            (true, Ok(Message::BatchPlan(head, tasks))) => {
                if from_b {
                    self.group_b_backends.insert(t.to);
                }
                self.saw_epoch(t.to, t.at, head.epoch);
                let set = self.planned.entry(t.to).or_default();
                set.extend(tasks.iter().map(|task| (task.task_id, head.epoch)));
            }
            (true, Ok(Message::Welcome(w))) => self.saw_epoch(t.to, t.at, w.epoch),
            (false, Ok(Message::BatchPlan(head, _))) if from_scheduler => {
                if !from_b {
                    let e = self.plan_times.entry(head.epoch).or_insert((t.at, t.at));
                    e.1 = e.1.max(t.at);
                }
                let away = self.moved_away.get(&t.from);
                if away.and_then(|a| a.get(head.model_id as usize)).copied().unwrap_or(false) {
                    self.unowned_plans.push(format!("batch {} of model {} planned at {} after the model moved away", head.batch_id, head.model_id, t.at));
                }
            }
            // Completions come from backends, and from the scheduler
            // when it fails a batch back or forwards one.
            (false, Ok(Message::Completion(head, _))) if !from_scheduler => {
                self.answered.entry(t.from).or_default().insert(head.task_id);
                if head.status == TaskStatus::Ok as u32 {
                    *self.executed.entry(head.task_id).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }

    /// Notes `t` in `trace` if it names the traced task.
    fn trace_message(&mut self, t: &Traffic<'_>) {
        let Some(id) = self.trace_task else { return };
        let what = match wire::decode(t.bytes) {
            Ok(Message::Task(x)) if x.task_id == id => format!("task, budget {} us", x.budget_ns / 1000),
            Ok(Message::Tasks(l)) if l.iter().any(|x| x.task_id == id) => "tasks (batched submission)".to_string(),
            Ok(Message::BatchPlan(h, ts)) if ts.iter().any(|x| x.task_id == id) => {
                format!("plan: batch {} of model {}, epoch {}, exec in {} us", h.batch_id, h.model_id, h.epoch, h.exec_in_ns / 1000)
            }
            Ok(Message::Completion(h, _)) if h.task_id == id => format!("completion, status {}", h.status),
            Ok(Message::Dropped(d)) if d.task_id == id => {
                format!("dropped, reason {}", wire::DropReason::from_u32(d.reason).map_or("unknown", |r| r.as_str()))
            }
            Ok(Message::Cancel(c)) if c.task_id == id => "cancel".to_string(),
            _ => return,
        };
        let fate = if t.delivered { "delivered" } else { "sent" };
        self.trace.push(format!("{} node {} -> node {} {fate}: {what}", t.at, t.from, t.to));
    }

    fn saw_epoch(&mut self, node: NodeId, at: Instant, epoch: u32) {
        let seen = self.epochs_seen.entry(node).or_default();
        if seen.last().is_none_or(|&(_, e)| epoch > e) {
            seen.push((at, epoch));
        }
    }

    /// The newest epoch backend `b` was delivered.
    fn newest(&self, b: NodeId) -> u32 {
        self.epochs_seen.get(&b).and_then(|s| s.last()).map_or(0, |s| s.1)
    }

    /// Tasks that backend `b` received in a plan and never answered (plans
    /// of an epoch older than the newest it saw are refused unexecuted:
    /// their tasks are the new leader's).
    pub fn unanswered(&self, b: NodeId) -> usize {
        let Some(planned) = self.planned.get(&b) else { return 0 };
        let newest = self.newest(b);
        let answered = self.answered.get(&b);
        planned.iter().filter(|&(t, &e)| e >= newest && !answered.is_some_and(|a| a.contains(t))).count()
    }

    /// A newer epoch than `epoch` that backend `b` had been delivered
    /// before `start` (a batch of `epoch` starting then broke the fence).
    pub fn newer_epoch_before(&self, b: NodeId, epoch: u32, start: Instant) -> Option<(Instant, u32)> {
        self.epochs_seen.get(&b)?.iter().copied().find(|&(at, e)| e > epoch && at < start)
    }

    /// The first plan of a newer epoch than `epoch` sent before `start`
    /// (a batch of `epoch` starting then on backend `b` ran after the new
    /// leader's first plan); none for group b's backends, whose scheduler
    /// is not in group a's election.
    pub fn newer_term_before(&self, b: NodeId, epoch: u32, start: Instant) -> Option<(u32, Instant)> {
        if self.group_b_backends.contains(&b) {
            return None;
        }
        self.plan_times.range(epoch + 1..).map(|(&e, &(first, _))| (e, first)).find(|&(_, first)| first < start)
    }

    /// An epoch whose leader still sent a plan after a newer epoch's first
    /// plan: two leaders planning in live terms.
    pub fn overlapping_terms(&self) -> Option<String> {
        let terms: Vec<(u32, (Instant, Instant))> = self.plan_times.iter().map(|(&e, &t)| (e, t)).collect();
        for (i, &(e, (_, last))) in terms.iter().enumerate() {
            if let Some(&(newer, (first, _))) = terms[i + 1..].iter().find(|&&(_, (first, _))| first < last) {
                return Some(format!("epoch {e} planned until {last} after epoch {newer} planned from {first}"));
            }
        }
        None
    }
}

/// What the harness observed, for the checks.
pub struct Observed<'a> {
    /// Plans the scheduler made onto a GPU before its previous planned
    /// batch there finished.
    pub overlapping_plans: u64,
    /// Batches an executor refused because their device was busy.
    pub busy_rejections: u64,
    /// What the network tap saw.
    pub ledger: &'a Ledger,
    /// Backends that ran from their start to the end of the run.
    pub surviving_backends: &'a [NodeId],
    /// Each live frontend's own counters, by slot.
    pub frontend_counters: &'a [(usize, CounterSnapshot)],
    /// The client.
    pub client: &'a Client,
    /// Each live frontend's staging slots still in use at the end, by slot.
    pub slots_in_use: &'a [(usize, usize)],
    /// Tasks the scheduler still holds at the end (queued or planned).
    pub scheduler_tasks: usize,
    /// Every message arrived (no loss, partition or crash): then nothing
    /// may be left behind anywhere.
    pub lossless: bool,
    /// Batches that started on a backend after it had seen a newer epoch
    /// than their own (the harness checks each report).
    pub fence_violations: &'a [String],
}

/// Appends a line to `out` for every invariant that did not hold.
pub fn check(o: &Observed<'_>, out: &mut Vec<String>) {
    let unended = o.client.unended();
    if unended > 0 {
        out.push(format!("{unended} requests never ended (unaccounted)"));
    }
    let twice = o.client.ended_twice();
    if twice > 0 {
        out.push(format!("{twice} requests were answered more than once"));
    }
    if o.overlapping_plans > 0 {
        out.push(format!("{} batches were planned onto a GPU still busy with another", o.overlapping_plans));
    }
    if o.busy_rejections > 0 {
        out.push(format!("{} batches reached a busy device", o.busy_rejections));
    }
    for &b in o.surviving_backends {
        let n = o.ledger.unanswered(b);
        if n > 0 {
            out.push(format!("backend node {b} received {n} planned tasks it never answered"));
        }
    }
    let mut dup: Vec<(u64, u32)> = o.ledger.executed.iter().filter(|(_, &n)| n > 1).map(|(&t, &n)| (t, n)).collect();
    if !dup.is_empty() {
        dup.sort_unstable();
        out.push(format!("{} tasks were executed more than once (first: task {:#x}, {} times)", dup.len(), dup[0].0, dup[0].1));
    }
    if let Some(first) = o.ledger.unowned_plans.first() {
        out.push(format!("{} plans of a model its scheduler no longer owned (first: {first})", o.ledger.unowned_plans.len()));
    }
    if let Some(why) = o.ledger.overlapping_terms() {
        out.push(format!("two leaders planned in live terms: {why}"));
    }
    out.extend(o.fence_violations.iter().cloned());
    if o.client.wrong_outputs > 0 {
        out.push(format!("{} answers carried another request's output", o.client.wrong_outputs));
    }
    out.extend(counter_mismatches(o.frontend_counters, o.client));
    for (i, c) in o.frontend_counters {
        if !c.balanced() {
            out.push(format!("frontend slot {i}: accepted {} != succeeded + dropped + failed + cancelled ({c:?})", c.accepted));
        }
    }
    // Every task left the scheduler (a queued one by its deadline at the
    // latest, a planned one by its batch's report or fail-back).
    if o.scheduler_tasks > 0 {
        out.push(format!("the scheduler still holds {} tasks after the run", o.scheduler_tasks));
    }
    if o.lossless {
        for &(i, n) in o.slots_in_use {
            if n > 0 {
                out.push(format!("frontend slot {i}: {n} staging slots (task ids) still in use after the run"));
            }
        }
    }
}
