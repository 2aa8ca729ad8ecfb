//! Open-loop HTTP load against the KServe v2 API.
//!
//! With no `--addr`, starts an in-process server (in-process cluster) and
//! loads it; with `--addr 127.0.0.1:PORT` (repeatable), loads those
//! frontends round-robin. Model ids are the positions in `--models`, which
//! must be the cluster's model list.
//!
//! `cargo run --release -p tools --example loadgen -- --rate 500 --duration 5`

use clap::Parser;
use frontend::loadgen::{self, LoadConfig, LoadModel};
use tools::inproc::server::{LocalConfig, LocalServer};
use frontend::models::{default_input, default_output, ModelCatalog};
use frontend::service::InferenceService;
use scheduler::sim::workload::{Arrival, Popularity, RateSchedule, Workload};
use scheduler::zoo::{Zoo, ZooSelection};
use std::net::SocketAddr;

#[derive(Parser)]
struct Args {
    /// Target frontends (loopback only, repeatable); none: start a server
    /// in-process.
    #[arg(long)]
    addr: Vec<SocketAddr>,
    /// Zoo table: 1080ti or a100.
    #[arg(long, default_value = "a100")]
    zoo: String,
    /// Models of the zoo: all, strong, weak, or names.
    #[arg(long, default_value = "ResNet50,DenseNet121")]
    models: String,
    /// Narrowest schedulable window of the in-process scheduler, ms (its
    /// timer's lateness bound).
    #[arg(long, default_value_t = 5.0)]
    timer_slack_ms: f64,
    /// Emulated GPUs of the in-process server.
    #[arg(long, default_value_t = 2)]
    gpus: u32,
    /// Total offered rate, requests per second.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// poisson, uniform or gamma:SHAPE.
    #[arg(long, default_value = "poisson")]
    arrival: String,
    /// equal or zipf:S.
    #[arg(long, default_value = "equal")]
    popularity: String,
    /// Rate schedule T0:M0,T1:M1,... (seconds:multiplier).
    #[arg(long, default_value = "")]
    schedule: String,
    /// Seconds of sending.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Most requests.
    #[arg(long, default_value_t = 1_000_000)]
    max_requests: u64,
    /// Most outstanding requests.
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let zoo = Zoo::parse(&a.zoo)?;
    let specs = ZooSelection::parse(&a.models)
        .select(zoo.models())
        ?;
    let workload = Workload {
        rate_rps: a.rate,
        arrival: Arrival::parse(&a.arrival)?,
        popularity: Popularity::parse(&a.popularity)?,
        schedule: RateSchedule::parse(&a.schedule)?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        ?;
    rt.block_on(async move {
        let local = match a.addr.first() {
            Some(_) => None,
            None => {
                let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&specs));
                cfg.cluster.gpus = a.gpus;
                cfg.cluster.timer_slack =
                    dataplane::time::Duration::from_millis_f64(a.timer_slack_ms);
                Some(LocalServer::start(cfg).await?)
            }
        };
        let targets = match &local {
            Some(l) => vec![l.addr()],
            None => a.addr.clone(),
        };
        let cfg = LoadConfig {
            targets,
            models: specs
                .iter()
                .enumerate()
                .map(|(i, m)| LoadModel::new(&m.name, i as u32))
                .collect(),
            input_elements: default_input().elements() as usize,
            output_bytes: default_output().byte_len() as usize,
            workload,
            duration: dataplane::time::Duration::from_secs_f64(a.duration),
            max_requests: a.max_requests,
            max_in_flight: a.max_in_flight,
            seed: a.seed,
            timeout_us: None,
            priority_mix: None,
        };
        let r = loadgen::run(cfg).await?;
        println!("{r}");
        if let Some(l) = local {
            let c = l.service().staging().counters().snapshot();
            println!("server counters: {c:?} balanced={}", c.balanced());
            let svc = l.service();
            for e in svc.catalog().entries() {
                let (b, ok) = (
                    svc.metrics().exec_count(e.id),
                    svc.metrics().successes(e.id),
                );
                println!(
                    "model {}: batches={b} successes={ok} mean_batch={:.2}",
                    e.spec.name,
                    ok as f64 / b.max(1) as f64
                );
            }
            l.stop().await;
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
