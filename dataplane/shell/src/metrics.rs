//! The one metrics mechanism of every role: a [`prometheus_client`]
//! registry behind a [`MetricsRegistry`], encoded as OpenMetrics text for
//! the one endpoint ([`crate::MetricsEndpoint`]) and for the
//! frontend's own `GET /metrics`.
//!
//! Each role registers its families once, at start, and keeps handles to
//! them; recording is then a relaxed atomic add on a handle (no lock, no
//! allocation, no label lookup: a labelled series' handle is resolved once,
//! outside the hot path, e.g. one per model or per drop reason). The
//! registry's lock is taken only to register and to encode a scrape.
//!
//! Besides prometheus-client's own [`Counter`], [`Gauge`] and [`Family`],
//! three metric types live here:
//! - [`Histogram`]: fixed integer bucket bounds over atomics
//!   (prometheus-client's histogram takes a mutex per observation);
//! - [`PlainCounter`]: a counter exposed under its exact name, without the
//!   `_total` suffix OpenMetrics gives counters (Triton's `nv_inference_*`
//!   names); OpenMetrics types such a series `unknown`;
//! - [`Computed`]: samples computed at scrape time from a closure (ratios,
//!   copies of another component's counters).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

/// The content type of [`MetricsRegistry::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A gauge holding an `f64`.
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// One label, e.g. `("model", "resnet".to_string())`.
pub type Label = (&'static str, String);

/// Every family of one process (or of one in-process component).
#[derive(Debug, Default)]
pub struct MetricsRegistry {
    inner: Mutex<Registry>,
}

impl MetricsRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `metric` as family `name`. Counters get `_total` appended
    /// by the encoder: give their name without it. Not for hot paths.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        // The encoder appends the full stop itself.
        let help = help.trim_end_matches('.');
        let mut r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        r.register(name, help, metric);
    }

    /// The OpenMetrics text of every family ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = String::with_capacity(8192);
        // Writing into a String cannot fail; our metrics never fail either.
        let _ = prometheus_client::encoding::text::encode(&mut s, &r);
        s
    }
}

// ---- histogram -------------------------------------------------------------------

#[derive(Debug)]
struct HistogramCells {
    bounds: &'static [u64],
    /// The bucket of an observation when the bounds have a closed form
    /// (many fine buckets); `None`: a search over `bounds`.
    index: Option<fn(u64) -> usize>,
    /// Non-cumulative counts per bucket; the last is `+Inf`.
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

/// A histogram of integer observations over fixed upper bounds
/// (`le`, inclusive; `+Inf` follows): one relaxed add per bucket and sum.
/// Clones share the counts.
#[derive(Clone, Debug)]
pub struct Histogram {
    cells: Arc<HistogramCells>,
}

impl Histogram {
    /// Empty, with upper bounds `bounds` (ascending).
    pub fn new(bounds: &'static [u64]) -> Self {
        Histogram {
            cells: Arc::new(HistogramCells {
                bounds,
                index: None,
                buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum: AtomicU64::new(0),
            }),
        }
    }

    /// Empty, with upper bounds `bounds` and `index(v)` giving the bucket
    /// of `v` (`bounds.len()` or more: `+Inf`) in constant time: for
    /// thousands of fine buckets, where a search per observation would
    /// cost too much.
    pub fn with_index(bounds: &'static [u64], index: fn(u64) -> usize) -> Self {
        Histogram {
            cells: Arc::new(HistogramCells {
                bounds,
                index: Some(index),
                buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum: AtomicU64::new(0),
            }),
        }
    }

    /// Counts one observation of `v`.
    pub fn observe(&self, v: u64) {
        let c = &self.cells;
        let i = match c.index {
            Some(f) => f(v).min(c.bounds.len()),
            None => c.bounds.iter().position(|&b| v <= b).unwrap_or(c.bounds.len()),
        };
        c.buckets[i].fetch_add(1, Relaxed);
        c.sum.fetch_add(v, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.cells.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// Sum of the observations so far.
    pub fn sum(&self) -> u64 {
        self.cells.sum.load(Relaxed)
    }

    /// Observations per bucket so far (not cumulative; the last is
    /// `+Inf`'s own), each read once.
    pub fn buckets(&self) -> Vec<u64> {
        self.cells.buckets.iter().map(|b| b.load(Relaxed)).collect()
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let c = &self.cells;
        let buckets: Vec<(f64, u64)> = c
            .bounds
            .iter()
            .map(|&b| b as f64)
            .chain(std::iter::once(f64::INFINITY))
            .zip(c.buckets.iter().map(|b| b.load(Relaxed)))
            .collect();
        let count = buckets.iter().map(|b| b.1).sum();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            c.sum.load(Relaxed) as f64,
            count,
            &buckets,
            None,
        )
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

// ---- plain counter ----------------------------------------------------------------

/// A monotonic counter exposed under its exact name, with no `_total`
/// suffix: for names fixed by another system (Triton's
/// `nv_inference_request_success`, ...). OpenMetrics reserves the
/// `counter` type for `_total` samples, so these are typed `unknown`.
/// Clones share the count.
#[derive(Clone, Debug, Default)]
pub struct PlainCounter {
    value: Arc<AtomicU64>,
}

impl PlainCounter {
    /// Adds one.
    pub fn inc(&self) {
        self.value.fetch_add(1, Relaxed);
    }
    /// Adds `v`.
    pub fn inc_by(&self, v: u64) {
        self.value.fetch_add(v, Relaxed);
    }
    /// The count.
    pub fn get(&self) -> u64 {
        self.value.load(Relaxed)
    }
}

impl EncodeMetric for PlainCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.get())
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

impl TypedMetric for PlainCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

// ---- computed at scrape time ----------------------------------------------------------

/// Where a [`Computed`] closure puts its samples.
pub struct Samples<'a, 'e> {
    encoder: &'a mut MetricEncoder<'e>,
    counter: bool,
    result: Result<(), std::fmt::Error>,
}

impl Samples<'_, '_> {
    /// The family's one unlabelled sample.
    pub fn value(&mut self, v: f64) {
        if self.result.is_ok() {
            self.result = if self.counter {
                self.encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(&v, None)
            } else {
                self.encoder.encode_gauge(&v)
            };
        }
    }
    /// A sample with `labels`.
    pub fn labelled(&mut self, labels: &[(&str, &str)], v: f64) {
        if self.result.is_ok() {
            let counter = self.counter;
            self.result = self.encoder.encode_family(&labels).and_then(|mut e| {
                if counter {
                    e.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(&v, None)
                } else {
                    e.encode_gauge(&v)
                }
            });
        }
    }
}

/// Computes samples.
pub type SampleFn = dyn Fn(&mut Samples<'_, '_>) + Send + Sync;

/// A family whose samples are computed when scraped (a ratio, or another
/// component's counters read where they are kept): a gauge, a counter
/// (`_total` appended) or, like [`PlainCounter`], a count under its exact
/// name (typed `unknown`).
pub struct Computed {
    kind: MetricType,
    f: Box<SampleFn>,
}

impl std::fmt::Debug for Computed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Computed").field("kind", &self.kind).finish()
    }
}

impl Computed {
    /// A gauge whose samples `f` gives.
    pub fn gauge(f: impl Fn(&mut Samples<'_, '_>) + Send + Sync + 'static) -> Self {
        Computed { kind: MetricType::Gauge, f: Box::new(f) }
    }
    /// A counter whose samples `f` gives (they must never decrease).
    pub fn counter(f: impl Fn(&mut Samples<'_, '_>) + Send + Sync + 'static) -> Self {
        Computed { kind: MetricType::Counter, f: Box::new(f) }
    }
    /// Counts under their exact names, as [`PlainCounter`]s.
    pub fn plain(f: impl Fn(&mut Samples<'_, '_>) + Send + Sync + 'static) -> Self {
        Computed { kind: MetricType::Unknown, f: Box::new(f) }
    }
    /// An unlabelled gauge of value `f()`.
    pub fn gauge_of(f: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        Self::gauge(move |s| s.value(f()))
    }
    /// An unlabelled counter of value `f()`.
    pub fn counter_of(f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self::counter(move |s| s.value(f() as f64))
    }
}

impl EncodeMetric for Computed {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counter = matches!(self.kind, MetricType::Counter);
        let mut s = Samples { encoder: &mut encoder, counter, result: Ok(()) };
        (self.f)(&mut s);
        s.result
    }
    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

// ---- the transports' process-wide counts ---------------------------------------------

/// Registers `symphony_links_closed_total{reason}`: links this process
/// closed for the peer's bytes (`bad_bytes`: a frame or record no decoder
/// accepts) or for link TLS (`tls`: a handshake or record that failed).
/// Both are process-wide counts the transports keep; each daemon calls
/// this once on the registry it serves.
pub fn register_link_closures(registry: &MetricsRegistry) {
    registry.register(
        "symphony_links_closed",
        "Links closed for what the peer sent: bytes no decoder accepts, or a link TLS failure",
        Computed::counter(|s| {
            s.labelled(&[("reason", "bad_bytes")], dataplane::transport::links_closed_on_bad_bytes() as f64);
            s.labelled(&[("reason", "tls")], dataplane::transport::tcp::links_closed_on_tls_failure() as f64);
        }),
    );
}

// ---- label handles ---------------------------------------------------------------

/// Registers a family `name` of metrics `M` with one label `key` and
/// returns one handle per value of `values`, in order: index the result by
/// a dense id (model id, reason index) on the hot path. Every series exists
/// (and is scraped) from the start.
pub fn labelled<M>(
    registry: &MetricsRegistry,
    name: &str,
    help: &str,
    key: &'static str,
    values: impl IntoIterator<Item = String>,
    make: fn() -> M,
) -> Vec<M>
where
    M: EncodeMetric + TypedMetric + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    labelled_by(registry, name, help, values.into_iter().map(|v| vec![(key, v)]).collect(), make)
}

/// Like [`labelled`] with several labels per series (`label_sets[i]` is
/// series `i`, labels in the order given).
pub fn labelled_by<M>(
    registry: &MetricsRegistry,
    name: &str,
    help: &str,
    label_sets: Vec<Vec<Label>>,
    make: fn() -> M,
) -> Vec<M>
where
    M: EncodeMetric + TypedMetric + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    let family: Family<Vec<Label>, M, fn() -> M> = Family::new_with_constructor(make);
    let handles = label_sets.iter().map(|l| family.get_or_create(l).clone()).collect();
    registry.register(name, help, family);
    handles
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::control::{metric, metric_sum};

    static BOUNDS: [u64; 3] = [1, 4, 16];

    #[test]
    fn families_encode_under_their_names() {
        let r = MetricsRegistry::new();
        let c: Counter = Counter::default();
        r.register("symphony_things", "Things seen.", c.clone());
        c.inc_by(3);
        let p = PlainCounter::default();
        r.register("nv_inference_count", "Inferences", p.clone());
        p.inc();
        let h = Histogram::new(&BOUNDS);
        r.register("symphony_batch_size", "Batch sizes", h.clone());
        for v in [1, 3, 4, 100] {
            h.observe(v);
        }
        let per_model = labelled(&r, "nv_inference_exec_count", "Executions", "model", ["a".to_string(), "b".to_string()], PlainCounter::default);
        per_model[1].inc_by(7);
        let sized = labelled(&r, "symphony_model_batch_size", "Batch sizes by model", "model", ["a".to_string()], || Histogram::new(&BOUNDS));
        sized[0].observe(2);
        r.register("symphony_ratio", "A ratio", Computed::gauge_of(|| 0.25));
        r.register(
            "nv_gpu_utilization",
            "Busy fraction",
            Computed::gauge(|s| {
                s.labelled(&[("gpu", "0")], 0.5);
                s.labelled(&[("gpu", "1")], 1.0);
            }),
        );
        r.register("symphony_copied", "Copied", Computed::counter_of(|| 9));
        let t = r.encode();
        assert!(t.contains("# HELP symphony_things Things seen.\n# TYPE symphony_things counter\n"), "{t}");
        assert_eq!(metric(&t, "symphony_things_total"), Some(3.0));
        assert_eq!(metric(&t, "nv_inference_count"), Some(1.0));
        assert!(t.contains("# TYPE nv_inference_count unknown"));
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"1.0\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"4.0\"}"), Some(3.0));
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"+Inf\"}"), Some(4.0));
        assert_eq!(metric(&t, "symphony_batch_size_sum"), Some(108.0));
        assert_eq!(metric(&t, "symphony_batch_size_count"), Some(4.0));
        assert_eq!(metric(&t, "nv_inference_exec_count{model=\"b\"}"), Some(7.0));
        assert_eq!(metric_sum(&t, "nv_inference_exec_count"), 7.0);
        assert_eq!(metric(&t, "symphony_model_batch_size_bucket{le=\"4.0\",model=\"a\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_ratio"), Some(0.25));
        assert_eq!(metric(&t, "nv_gpu_utilization{gpu=\"1\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_copied_total"), Some(9.0));
        assert!(t.ends_with("# EOF\n"));
        assert_eq!((h.count(), h.sum()), (4, 108));
    }
}
