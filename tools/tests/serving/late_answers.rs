//! Issue 54 item 4: a model that serves late answers (the default of a
//! model-repository model, as Triton queues) answers every request of a
//! burst the cluster cannot finish in time, late and counted late; the
//! same burst against early refusal (the zoo's default) is partly
//! dropped for its deadline. Over the in-process stack (real scheduler,
//! frontend and backend nodes; one emulated GPU).

use dataplane::wire::DropReason;
use frontend::models::{LateAnswers, ModelCatalog, DEFAULT_INPUT_BYTES};
use frontend::service::{infer, InferResult, InferenceService};
use frontend::staging::RequestOptions;
use scheduler::zoo::ModelSpec;
use std::time::{Duration as StdDuration, Instant as StdInstant};
use tools::inproc::server::{LocalConfig, LocalServer};

/// Requests sent at once: l(b) = b + 4 ms against a 10 ms SLO finishes at
/// most 6 of them in time, so most of the burst cannot meet its deadline.
const BURST: usize = 40;

async fn start(late: LateAnswers) -> LocalServer {
    let specs = vec![ModelSpec::linear("tight", 1.0, 4.0, 10.0).unwrap()];
    let mut catalog = ModelCatalog::with_default_tensors(&specs);
    assert!(catalog.set_late_answers(0, late));
    let mut cfg = LocalConfig::new(catalog);
    cfg.cluster.gpus = 1;
    cfg.slots = 256;
    LocalServer::start(cfg).await.expect("server starts")
}

/// Sends [`BURST`] requests at once; their results.
async fn burst(s: &LocalServer) -> Vec<InferResult> {
    let svc = s.service().clone();
    let sent: Vec<_> = (0..BURST)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let input = vec![i as u8; DEFAULT_INPUT_BYTES as usize];
                let budget = svc.catalog().by_id(0).unwrap().spec.slo;
                infer(&*svc, 0, &input, budget, RequestOptions::default(), StdInstant::now()).await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(BURST);
    for h in sent {
        out.push(h.await.expect("request task"));
    }
    out
}

/// The sum of `symphony_requests_by_level_total` for model `tight` and
/// `outcome` over every level.
fn by_level(s: &LocalServer, outcome: &str) -> f64 {
    let needle = format!("outcome=\"{outcome}\"");
    s.service()
        .metrics()
        .encode()
        .lines()
        .filter(|l| l.starts_with("symphony_requests_by_level_total{") && l.contains("model=\"tight\"") && l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_past_the_deadline_is_answered_late_when_the_model_serves_late() {
    let s = start(LateAnswers::Serve { max_wait: StdDuration::from_secs(5) }).await;
    let results = burst(&s).await;
    let ok = results.iter().filter(|r| matches!(r, InferResult::Ok(_))).count();
    assert_eq!(ok, BURST, "every request answered: {results:?}");
    let late = by_level(&s, "late");
    assert!(late >= 1.0, "the answers past the SLO are counted late ({late})");
    assert_eq!(by_level(&s, "ok") + late, BURST as f64, "each request counted once, on time or late");
    assert_eq!(by_level(&s, "deadline_unmeetable") + by_level(&s, "early_drop"), 0.0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_burst_is_refused_early_when_the_model_refuses() {
    let s = start(LateAnswers::Refuse).await;
    let results = burst(&s).await;
    let dropped = results
        .iter()
        .filter(|r| matches!(r, InferResult::Dropped(DropReason::DeadlineUnmeetable | DropReason::EarlyDrop)))
        .count();
    assert!(dropped >= BURST / 2, "most of the burst is dropped for its deadline ({dropped} of {BURST}): {results:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_is_still_refused_past_its_bound() {
    // A bound of one SLO leaves no second try: as early refusal.
    let s = start(LateAnswers::Serve { max_wait: StdDuration::from_millis(10) }).await;
    let results = burst(&s).await;
    let dropped = results.iter().filter(|r| matches!(r, InferResult::Dropped(_))).count();
    assert!(dropped >= BURST / 2, "past its bound a request is refused ({dropped} of {BURST})");
    s.stop().await;
}
