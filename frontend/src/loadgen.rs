//! An open-loop HTTP load generator for capacity tests: per-model arrival
//! streams (Poisson, Gamma or uniform gaps, rate schedules; the
//! simulator's [`Arrivals`]) fire KServe v2 JSON inference requests at
//! a loopback server through a real HTTP client (hyper-util's pooled
//! client). Requests are sent on schedule whether or not earlier ones have
//! returned (open loop), spread round-robin over one or more frontends;
//! every response is checked twice: its `id` must be the request's (a
//! response that went to the wrong client fails this), and its output must
//! be the cluster-wide reference output
//! ([`dataplane::reference::expected_output`]) of the model and input that
//! were sent.

use crate::tensor::{encode_json_data, reference_output, DataType};
use bytes::Bytes;
use dataplane::time::Duration;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use scheduler_core::sim::workload::{Arrivals, Workload};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// A model the load targets: its name in the API and its cluster model id
/// (which the reference output depends on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadModel {
    /// Name in the URL.
    pub name: String,
    /// Cluster model id (index in the cluster's model list).
    pub id: u32,
    /// The model's latency objective as the client sees it: a correct
    /// answer that takes longer counts as `late`, not `ok`. `None`: no
    /// objective (every correct answer is ok).
    pub slo: Option<std::time::Duration>,
}

impl LoadModel {
    /// The same model with a client-side latency objective.
    pub fn with_slo(mut self, slo: std::time::Duration) -> Self {
        self.slo = Some(slo);
        self
    }

    /// A model named `name` with cluster id `id`.
    pub fn new(name: &str, id: u32) -> Self {
        LoadModel {
            name: name.to_string(),
            id,
            slo: None,
        }
    }
}

/// One load run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Frontend HTTP addresses, all loopback; request `n` goes to
    /// `targets[n % targets.len()]`.
    pub targets: Vec<SocketAddr>,
    /// Models (stream `i` targets model `i`).
    pub models: Vec<LoadModel>,
    /// Elements of each model's FP32 input (the server's declared shape is `[1, n]`).
    pub input_elements: usize,
    /// Bytes of the output to verify (the model's output tensor length,
    /// e.g. [`crate::models::DEFAULT_OUTPUT_BYTES`]).
    pub output_bytes: usize,
    /// Offered load (total rate, gaps, split over models, schedule).
    pub workload: Workload,
    /// Stop sending after this long.
    pub duration: Duration,
    /// Stop sending after this many requests.
    pub max_requests: u64,
    /// Requests outstanding at most; an arrival beyond that is counted as
    /// `skipped` rather than delaying the schedule.
    pub max_in_flight: usize,
    /// Seed of the arrival streams and input data.
    pub seed: u64,
    /// Optional `timeout` parameter (µs) sent with each request.
    pub timeout_us: Option<u64>,
    /// Two priority classes: this share of requests (chosen per request
    /// number from `seed`, so a run is reproducible) is sent with
    /// `priority` 1 (high), the rest with 2 (low); `None`: no `priority`
    /// parameter, and only [`LoadReport::classes`]`[1]` counts.
    pub priority_mix: Option<f64>,
}

/// The `priority` parameter of request `n`: 1 for a `mix` share of
/// requests, else 2 (a hash of the seed and the number, not a shared RNG,
/// so the class of a request does not depend on skipped arrivals).
pub fn priority_of(seed: u64, n: u64, mix: f64) -> u32 {
    let mut z = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    if unit < mix { 1 } else { 2 }
}

/// One priority class's outcomes (see [`LoadReport::classes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounts {
    /// Requests sent in the class.
    pub sent: u64,
    /// Answered correctly within the objective.
    pub ok: u64,
    /// Answered correctly after the objective.
    pub late: u64,
    /// 503 (dropped, timed out, no capacity).
    pub unavailable: u64,
    /// Anything else (wrong answer, other status, transport failure).
    pub other: u64,
}

impl ClassCounts {
    /// Share of the class's requests not answered correctly in time.
    pub fn bad_rate(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            (self.sent - self.ok.min(self.sent)) as f64 / self.sent as f64
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: u64,
    /// 200 with the right output and id, within the model's objective.
    pub ok: u64,
    /// 200 with the right output and id, after the model's objective.
    pub late: u64,
    /// 200 whose output did not match what was sent (right id).
    pub wrong_output: u64,
    /// 200 whose `id` was not the request's: a response delivered to the
    /// wrong client.
    pub wrong_id: u64,
    /// 503 (dropped, timed out, no capacity).
    pub unavailable: u64,
    /// Other 4xx.
    pub client_errors: u64,
    /// Other 5xx.
    pub server_errors: u64,
    /// Connection or protocol failures.
    pub transport_errors: u64,
    /// Arrivals not sent because `max_in_flight` requests were outstanding.
    pub skipped: u64,
    /// Wall time from the first send to the last response.
    pub elapsed_s: f64,
    /// Latency of successful requests, ms: p50, p90, p99, p99.9, max.
    pub latency_ms: [f64; 5],
    /// All requests' latency (any status), ms: p50, p99.
    pub all_latency_ms: [f64; 2],
    /// Per [`BIN`] of intended send time from the start: requests sent
    /// then, and how many of them ended `ok` (goodput over time, e.g.
    /// around a scheduler failover).
    pub bins: Vec<LoadBin>,
    /// Outcomes per priority class: `[0]` high (`priority` 1), `[1]` low
    /// (`priority` 2, and every request without [`LoadConfig::priority_mix`]).
    pub classes: [ClassCounts; 2],
}

/// Width of [`LoadReport::bins`].
pub const BIN: Duration = Duration::from_millis(250);

/// One bin of [`LoadReport::bins`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadBin {
    /// Requests whose intended send time fell in the bin.
    pub sent: u64,
    /// Of those, answered correctly within the objective.
    pub ok: u64,
}

impl LoadReport {
    /// Successful requests per second.
    pub fn goodput_rps(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.ok as f64 / self.elapsed_s
        } else {
            0.0
        }
    }
    /// Every sent request got exactly one classified answer.
    pub fn balanced(&self) -> bool {
        self.sent
            == self.ok
                + self.late
                + self.wrong_output
                + self.wrong_id
                + self.unavailable
                + self.client_errors
                + self.server_errors
                + self.transport_errors
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = &self.latency_ms;
        write!(
            f,
            "sent={} ok={} late={} wrong_output={} wrong_id={} unavailable_503={} client_4xx={} server_5xx={} transport={} skipped={} elapsed={:.2}s goodput={:.1} rps \
             latency_200_ms p50={:.2} p90={:.2} p99={:.2} p99.9={:.2} max={:.2}",
            self.sent, self.ok, self.late, self.wrong_output, self.wrong_id, self.unavailable, self.client_errors, self.server_errors,
            self.transport_errors, self.skipped, self.elapsed_s, self.goodput_rps(), l[0], l[1], l[2], l[3], l[4]
        )
    }
}

/// How one response was classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The request's id and the reference output.
    Ok,
    /// The request's id, another output.
    WrongOutput,
    /// Another request's id (or none, or not JSON).
    WrongId,
}

enum Answer {
    Ok,
    Late,
    Wrong,
    WrongId,
    Status(u16),
    Transport,
}

/// Deterministic input values of request `n`: small integers (exact in FP32
/// and JSON).
fn input_values(seed: u64, n: u64, elements: usize) -> Vec<f32> {
    let mut x = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..elements)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as f32 - 1000.0
        })
        .collect()
}

/// Why a load run did not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No frontend address given.
    #[error("no targets to load")]
    NoTargets,
    /// A target outside loopback.
    #[error("refusing to load {target}: the load generator targets loopback addresses only")]
    NotLoopback {
        /// The refused address.
        target: SocketAddr,
    },
    /// No model given.
    #[error("no models to load")]
    NoModels,
    /// The latency histogram could not be made.
    #[error("latency histogram: {0}")]
    Histogram(#[from] hdrhistogram::CreationError),
}


fn check(cfg: &LoadConfig) -> Result<(), LoadError> {
    if cfg.targets.is_empty() {
        return Err(LoadError::NoTargets);
    }
    if let Some(&target) = cfg.targets.iter().find(|t| !t.ip().is_loopback()) {
        return Err(LoadError::NotLoopback { target });
    }
    if cfg.models.is_empty() {
        return Err(LoadError::NoModels);
    }
    Ok(())
}

/// Runs the load; returns once every sent request has been answered.
pub async fn run(cfg: LoadConfig) -> Result<LoadReport, LoadError> {
    check(&cfg)?;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(cfg.max_in_flight.max(1))
        .build_http();
    let mut arrivals =
        Arrivals::for_model_count(cfg.models.len(), &cfg.workload, cfg.seed, cfg.duration);
    let limit = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Answer, u64, usize, usize)>();
    let origin = tokio::time::Instant::now();
    let mut report = LoadReport::default();
    let mut n: u64 = 0;
    while n < cfg.max_requests {
        let Some((t, i)) = arrivals.next() else {
            break;
        };
        tokio::time::sleep_until(origin + std::time::Duration::from_nanos(t.as_nanos())).await;
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            report.skipped += 1;
            continue;
        };
        let values = input_values(cfg.seed, n, cfg.input_elements);
        let id = format!("req-{n}");
        let mut body = json!({
            "id": id,
            "inputs": [{"name": "INPUT0", "shape": [1, cfg.input_elements], "datatype": "FP32", "data": values}],
        });
        let mut parameters = serde_json::Map::new();
        if let Some(us) = cfg.timeout_us {
            parameters.insert("timeout".into(), json!(us));
        }
        let priority = cfg.priority_mix.map(|mix| priority_of(cfg.seed, n, mix));
        if let Some(p) = priority {
            parameters.insert("priority".into(), json!(p));
        }
        if !parameters.is_empty() {
            body["parameters"] = Value::Object(parameters);
        }
        let class = usize::from(priority != Some(1));
        report.classes[class].sent += 1;
        let target = cfg.targets[(n % cfg.targets.len() as u64) as usize];
        let model = &cfg.models[i as usize];
        let uri = format!("http://{target}/v2/models/{}/infer", model.name);
        let model_id = model.id;
        let slo = model.slo;
        let client = client.clone();
        let tx = tx.clone();
        let out_n = cfg.output_bytes;
        n += 1;
        report.sent += 1;
        let bin = usize::try_from(t.as_nanos() / BIN.as_nanos().max(1)).unwrap_or(usize::MAX);
        if let Some(b) = report.bin(bin) {
            b.sent += 1;
        }
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            let mut answer = send_one(&client, &uri, &body, &id, model_id, &values, out_n).await;
            let took = start.elapsed();
            if matches!(answer, Answer::Ok) && slo.is_some_and(|s| took > s) {
                answer = Answer::Late;
            }
            let _ = tx.send((answer, took.as_micros() as u64, bin, class));
            drop(permit);
        });
    }
    drop(tx);
    let mut ok_hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut all_hist = ok_hist.clone();
    while let Some((answer, us, bin, class)) = rx.recv().await {
        let us = us.max(1);
        if matches!(answer, Answer::Ok) {
            if let Some(b) = report.bin(bin) {
                b.ok += 1;
            }
        }
        let _ = all_hist.record(us);
        let c = &mut report.classes[class];
        match answer {
            Answer::Ok => c.ok += 1,
            Answer::Late => c.late += 1,
            Answer::Status(503) => c.unavailable += 1,
            _ => c.other += 1,
        }
        report.count(answer, us, &mut ok_hist);
    }
    report.elapsed_s = origin.elapsed().as_secs_f64();
    report.set_latencies(&ok_hist, &all_hist);
    Ok(report)
}

impl LoadReport {
    /// Bin `i`, grown on first use (`None` past a day of bins: ignored).
    fn bin(&mut self, i: usize) -> Option<&mut LoadBin> {
        if i > 24 * 3600 * 4 {
            return None;
        }
        if self.bins.len() <= i {
            self.bins.resize(i + 1, LoadBin::default());
        }
        self.bins.get_mut(i)
    }

    /// Counts one answer; successes (late or not) go into `ok_hist`.
    fn count(&mut self, answer: Answer, us: u64, ok_hist: &mut Histogram<u64>) {
        let report = self;
        match answer {
            Answer::Ok => {
                report.ok += 1;
                let _ = ok_hist.record(us);
            }
            Answer::Late => {
                report.late += 1;
                let _ = ok_hist.record(us);
            }
            Answer::Wrong => report.wrong_output += 1,
            Answer::WrongId => report.wrong_id += 1,
            Answer::Status(503) => report.unavailable += 1,
            Answer::Status(s) if (400..500).contains(&s) => report.client_errors += 1,
            Answer::Status(_) => report.server_errors += 1,
            Answer::Transport => report.transport_errors += 1,
        }
    }

    /// Latency percentiles (ms) from the histograms (microseconds).
    fn set_latencies(&mut self, ok_hist: &Histogram<u64>, all_hist: &Histogram<u64>) {
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        self.latency_ms = [
            ms(ok_hist, 0.5),
            ms(ok_hist, 0.9),
            ms(ok_hist, 0.99),
            ms(ok_hist, 0.999),
            ok_hist.max() as f64 / 1000.0,
        ];
        self.all_latency_ms = [ms(all_hist, 0.5), ms(all_hist, 0.99)];
    }
}

#[allow(clippy::too_many_arguments)]
async fn send_one<C>(
    client: &Client<C, Full<Bytes>>,
    uri: &str,
    body: &Value,
    id: &str,
    model_id: u32,
    values: &[f32],
    out_bytes: usize,
) -> Answer
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let Ok(bytes) = serde_json::to_vec(body) else {
        return Answer::Transport;
    };
    let Ok(req) = Request::post(uri)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
    else {
        return Answer::Transport;
    };
    let Ok(resp) = client.request(req).await else {
        return Answer::Transport;
    };
    let status = resp.status().as_u16();
    let Ok(body) = resp.into_body().collect().await else {
        return Answer::Transport;
    };
    if status != 200 {
        return Answer::Status(status);
    }
    match verify(&body.to_bytes(), id, model_id, values, out_bytes) {
        Verdict::Ok => Answer::Ok,
        Verdict::WrongOutput => Answer::Wrong,
        Verdict::WrongId => Answer::WrongId,
    }
}

/// Checks a JSON inference response: it must carry `id` (else
/// [`Verdict::WrongId`]) and, decoded with the datatype it declares, be
/// exactly the reference output of model `model_id` for `values` (FP32,
/// little-endian), `out_bytes` long.
pub fn verify(body: &[u8], id: &str, model_id: u32, values: &[f32], out_bytes: usize) -> Verdict {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Verdict::WrongId;
    };
    if v["id"] != id {
        return Verdict::WrongId;
    }
    let out = &v["outputs"][0];
    let Some(dt) = out["datatype"].as_str().and_then(DataType::from_kserve) else {
        return Verdict::WrongOutput;
    };
    let mut got = vec![0u8; out_bytes];
    if !out_bytes.is_multiple_of(dt.size() as usize) || encode_json_data(&out["data"], dt, &mut got).is_err()
    {
        return Verdict::WrongOutput;
    }
    let input: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut expect = vec![0u8; out_bytes];
    reference_output(model_id, &input, &mut expect);
    if got == expect {
        Verdict::Ok
    } else {
        Verdict::WrongOutput
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_priority_mix_picks_about_its_share_reproducibly() {
        let high = (0..10_000).filter(|&n| priority_of(7, n, 0.2) == 1).count();
        assert!((1_800..=2_200).contains(&high), "{high}");
        assert!((0..100).all(|n| priority_of(7, n, 0.2) == priority_of(7, n, 0.2)));
        assert!((0..100).all(|n| priority_of(7, n, 0.0) == 2 && priority_of(7, n, 1.0) == 1));
    }
}
