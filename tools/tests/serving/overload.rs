//! Issue 17's long acceptance run (about 25 s), `#[ignore]`d in plain
//! `cargo test` and run by tests/run.sh on its own (`--ignored`): a small emulated cluster (one GPU, peak under 500 requests/s, so
//! the load generator does not compete for the 2 cores) is offered a
//! ladder of rates up to 500/s to find its peak goodput, then 3x that peak with a
//! bounded queue: goodput stays >= 98% of the peak and the excess is
//! shed (refused as overloaded at the bound, or dropped as unmeetable
//! before it: the deadline sheds first when the bound exceeds what an SLO
//! window holds).

use frontend::models::{ModelCatalog, DEFAULT_INPUT_BYTES};
use frontend::service::{infer, InferResult};
use frontend::staging::RequestOptions;
use scheduler::types::Admission;
use scheduler::zoo::ModelSpec;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant as StdInstant};
use tools::inproc::server::{LocalConfig, LocalServer};

/// (goodput, drops of any reason: overloaded or unmeetable) of `rate` requests/s offered open loop for `secs`.
async fn offer(server: &LocalServer, rate: f64, secs: f64) -> (f64, u64) {
    let svc = server.service().clone();
    let (ok, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tick = tokio::time::interval(StdDuration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let n = (rate * secs) as u64;
    let mut calls = Vec::with_capacity(n as usize);
    for _ in 0..n {
        tick.tick().await;
        let (svc, ok, refused) = (svc.clone(), ok.clone(), refused.clone());
        calls.push(tokio::spawn(async move {
            let input = vec![1u8; DEFAULT_INPUT_BYTES as usize];
            match infer(&*svc, 0, &input, dataplane::time::Duration::from_millis(100), RequestOptions::default(), StdInstant::now()).await {
                InferResult::Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                InferResult::Dropped(_) => refused.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
        }));
    }
    for c in calls {
        let _ = c.await;
    }
    (ok.load(Ordering::Relaxed) as f64 / secs, refused.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 25 s alone; tests/run.sh runs it: cargo test --test serving -- --ignored overload::"]
async fn three_times_overload_keeps_98_percent_of_peak_goodput() {
    // l(b) = 2b + 10 ms, SLO 100 ms: about 400 requests/s on one GPU.
    let models = vec![ModelSpec::linear("m", 2.0, 10.0, 100.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models));
    cfg.cluster.gpus = 1;
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(10);
    cfg.admission = vec![Admission { max_queue: 64, ..Admission::default() }];
    let server = LocalServer::start(cfg).await.expect("server starts");
    let secs = 4.0;
    let mut peak: f64 = 0.0;
    for rate in [300.0, 400.0, 450.0, 500.0] {
        let (good, _) = offer(&server, rate, secs).await;
        eprintln!("offered {rate:.0}/s: goodput {good:.1}/s");
        peak = peak.max(good);
    }
    let over = 3.0 * peak;
    let (good, refused) = offer(&server, over, secs).await;
    eprintln!("peak goodput {peak:.1}/s; at 3x ({over:.0}/s): goodput {good:.1}/s ({:.1}% of peak), {refused} dropped (overloaded or deadline unmeetable)", good / peak * 100.0);
    assert!(good >= 0.98 * peak, "goodput {good:.1}/s under 3x overload, peak {peak:.1}/s");
    assert!(refused > 0, "the excess was shed");
    server.stop().await;
}
