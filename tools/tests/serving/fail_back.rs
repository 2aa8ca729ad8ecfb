//! Issue 54: a batch the scheduler gives up (its backend left while the
//! batch ran, or it did not report within the grace after a host stall)
//! is the cluster's failure, not the request's: a model that serves late
//! answers sends the request again, counted as a resend, and answers it;
//! a model that refuses early answers the failure as it is. One request
//! over the in-process stack (real scheduler, frontend and two backend
//! nodes) on a virtual clock: the backend holding its batch is killed
//! the moment the batch arrives there, before it can finish.

use dataplane::reference::expected_output;
use dataplane::time::{Duration, Instant};
use dataplane::transport::sim::{FaultConfig, SimNet};
use dataplane::wire::{DropReason, TaskStatus};
use frontend::models::{LateAnswers, ModelCatalog, Resend, DEFAULT_INPUT_BYTES, DEFAULT_OUTPUT_BYTES};
use frontend::service::{infer, resend_cause, InferResult, InferenceService};
use frontend::staging::RequestOptions;
use scheduler::zoo::ModelSpec;
use std::sync::Arc;
use tools::inproc::cluster::{ClusterSpec, NodeCluster};

/// Virtual time per step of the driver: far below the batch's 5 ms, so
/// the batch is seen at its backend before it can finish.
const STEP: Duration = Duration::from_micros(100);
/// Steps the cluster gets to form (join gate included) and to answer.
const MAX_STEPS: u32 = 200_000;

/// Two backends of one GPU each serving model `tight` (l(b) = b + 4 ms,
/// SLO 100 ms), formed: every GPU online.
fn formed_cluster(late: LateAnswers) -> (NodeCluster, Instant) {
    let models = vec![ModelSpec::linear("tight", 1.0, 4.0, 100.0).unwrap()];
    let mut spec = ClusterSpec::new(models.clone(), 1, 2, 1);
    let mut catalog = ModelCatalog::with_default_tensors(&models);
    assert!(catalog.set_late_answers(0, late));
    spec.catalog = Arc::new(catalog);
    let net = SimNet::new(0, FaultConfig { base_delay: Duration::from_micros(5), read_delay: Duration::from_micros(5), ..FaultConfig::default() });
    let mut cluster = NodeCluster::new(spec, net, None).expect("cluster");
    let mut now = Instant::ZERO;
    for _ in 0..MAX_STEPS {
        cluster.poll(now, &mut |_| {});
        let registered = cluster.frontend(0).is_some_and(|h| h.node.is_registered());
        if registered && cluster.scheduler().map_or(0, |s| s.plane().online_gpus()) == 2 {
            return (cluster, now);
        }
        now += STEP;
    }
    panic!("the cluster did not form within {MAX_STEPS} steps");
}

/// The value of the `symphony_late_resends_total` series of `cause`.
fn resends(svc: &impl InferenceService, cause: Resend) -> f64 {
    let needle = format!("cause=\"{}\"", cause.as_str());
    svc.metrics()
        .encode()
        .lines()
        .filter(|l| l.starts_with("symphony_late_resends_total{") && l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends one request and drives the cluster until it is answered,
/// killing (for good) the backend its first batch is planned to as soon
/// as the batch is there. Returns the result, the frontend's resends of
/// each cause and the tasks the scheduler failed back.
async fn one_request_whose_batch_is_lost(late: LateAnswers) -> (InferResult, [f64; 3], u64) {
    let (mut cluster, mut now) = formed_cluster(late);
    let svc = cluster.frontend(0).expect("frontend").service.clone();
    let input = vec![7u8; DEFAULT_INPUT_BYTES as usize];
    let sent = {
        let (svc, input) = (svc.clone(), input.clone());
        tokio::spawn(async move {
            let slo = svc.catalog().by_id(0).expect("model").spec.slo;
            infer(&*svc, 0, &input, slo, RequestOptions::default(), std::time::Instant::now()).await
        })
    };
    let mut killed = None;
    for _ in 0..MAX_STEPS {
        if sent.is_finished() {
            break;
        }
        cluster.poll(now, &mut |_| {});
        if killed.is_none() {
            killed = (0..2).find(|&i| cluster.backend(i).is_some_and(|b| b.node.worker().batches_in_flight() > 0));
            if let Some(i) = killed {
                assert_eq!(cluster.kill_backend(i, None), Some(1), "the batch is at backend {i} when it dies");
            }
        }
        now += STEP;
        // The request's task runs on another worker thread: let it take
        // its outcome and send the next try.
        tokio::task::yield_now().await;
    }
    assert!(killed.is_some(), "no batch ever reached a backend");
    assert!(sent.is_finished(), "no answer within {MAX_STEPS} steps");
    let result = sent.await.expect("request task");
    if let InferResult::Ok(out) = &result {
        let mut want = vec![0u8; DEFAULT_OUTPUT_BYTES as usize];
        expected_output(0, &input, &mut want);
        assert_eq!(out, &want, "the answer is the model's output for the input sent");
    }
    let failed_back = cluster.scheduler().expect("scheduler").plane().metrics().failed_back.get();
    (result, Resend::ALL.map(|c| resends(&*svc, c)), failed_back)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_scheduler_gives_up_is_sent_again_when_the_model_serves_late() {
    let (result, resent, failed_back) = one_request_whose_batch_is_lost(LateAnswers::Serve { max_wait: std::time::Duration::from_secs(5) }).await;
    assert_eq!(failed_back, 1, "the scheduler failed the batch back once");
    assert!(matches!(result, InferResult::Ok(_)), "answered after a resend: {result:?}");
    assert_eq!(resent, [0.0, 1.0, 0.0], "one resend, counted as abandoned (deadline, abandoned, input_unavailable)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_scheduler_gives_up_is_answered_as_failed_when_the_model_refuses() {
    let (result, resent, failed_back) = one_request_whose_batch_is_lost(LateAnswers::Refuse).await;
    assert_eq!(failed_back, 1);
    assert_eq!(result, InferResult::Failed(TaskStatus::Abandoned));
    assert_eq!(resent, [0.0; 3], "nothing sent again");
}

#[test]
fn only_the_clusters_failures_are_sent_again() {
    let resent = [
        (InferResult::Dropped(DropReason::DeadlineUnmeetable), Some(Resend::Deadline)),
        (InferResult::Dropped(DropReason::EarlyDrop), Some(Resend::Deadline)),
        (InferResult::Failed(TaskStatus::Abandoned), Some(Resend::Abandoned)),
        (InferResult::Failed(TaskStatus::InputUnavailable), Some(Resend::InputUnavailable)),
        (InferResult::Dropped(DropReason::InputUnavailable), Some(Resend::InputUnavailable)),
    ];
    for (r, cause) in &resent {
        assert_eq!(resend_cause(r), *cause, "{r:?}");
    }
    // The model failing on its backend, the admission bound, the
    // client's own limits and the rest are answered as they ended.
    let answered = [
        InferResult::Failed(TaskStatus::ExecFailed),
        InferResult::Dropped(DropReason::Overloaded),
        InferResult::Dropped(DropReason::Timeout),
        InferResult::Dropped(DropReason::Cancelled),
        InferResult::Dropped(DropReason::Shutdown),
        InferResult::Dropped(DropReason::UnknownModel),
        InferResult::Dropped(DropReason::FrontendLost),
        InferResult::TimedOut,
        InferResult::Unloaded,
        InferResult::Ok(Vec::new()),
    ];
    for r in &answered {
        assert_eq!(resend_cause(r), None, "{r:?}");
    }
}
