//! Latency recording (HdrHistogram) and the three output forms: a
//! perftest-style table, CSV, and JSON carrying the raw histograms in
//! HdrHistogram's interchange form (V2 compressed, base64).

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::fail::{Fail, Res};

/// Significant figures kept by every histogram (0.1% value resolution).
pub const SIGFIGS: u8 = 3;
/// Largest value recorded, ns (larger ones saturate): one hour.
const MAX_NS: u64 = 3_600_000_000_000;

/// Latencies of one kind, in nanoseconds: the histogram for percentiles,
/// exact min/max/sum on the side.
#[derive(Clone, Debug)]
pub struct Recorder {
    hist: Histogram<u64>,
    min: u64,
    max: u64,
    sum: u128,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Recorder {
            hist: Histogram::new_with_bounds(1, MAX_NS, SIGFIGS).expect("static bounds are valid"),
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }
    /// Records one latency.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        let v = ns.clamp(1, MAX_NS);
        self.hist.saturating_record(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }
    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Recorder) {
        let _ = self.hist.add(&other.hist);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }
    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }
    /// The histogram.
    #[cfg(test)]
    pub fn hist(&self) -> &Histogram<u64> {
        &self.hist
    }
    /// Value at percentile `p` (0..=100), ns.
    pub fn percentile_ns(&self, p: f64) -> u64 {
        self.hist.value_at_quantile(p / 100.0)
    }
    /// Summary in microseconds.
    pub fn summary(&self, name: &str, bytes: u64) -> Res<Metric> {
        let n = self.count();
        let us = |ns: u64| ns as f64 / 1000.0;
        Ok(Metric {
            name: name.to_string(),
            bytes,
            iterations: n,
            t_min: if n == 0 { 0.0 } else { us(self.min) },
            t_max: us(self.max),
            t_typical: us(self.hist.value_at_quantile(0.5)),
            t_avg: if n == 0 {
                0.0
            } else {
                self.sum as f64 / n as f64 / 1000.0
            },
            t_stdev: if n == 0 {
                0.0
            } else {
                self.hist.stdev() / 1000.0
            },
            p99: us(self.hist.value_at_quantile(0.99)),
            p99_9: us(self.hist.value_at_quantile(0.999)),
            p99_99: us(self.hist.value_at_quantile(0.9999)),
            histogram: encode_hist(&self.hist)?,
            histogram_unit: "ns".to_string(),
        })
    }
}

/// HdrHistogram interchange text: base64 of the V2 deflate-compressed form.
pub fn encode_hist(h: &Histogram<u64>) -> Res<String> {
    let mut bytes = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .map_err(|e| Fail::runtime(format!("histogram serialization: {e:?}")))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Inverse of [`encode_hist`] (accepts uncompressed V2 too).
pub fn decode_hist(text: &str) -> Res<Histogram<u64>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(Fail::caused("histogram is not base64"))?;
    Deserializer::new()
        .deserialize(&mut std::io::Cursor::new(bytes))
        .map_err(|e| Fail::runtime(format!("histogram does not decode: {e:?}")))
}

/// One latency metric, perftest's columns in microseconds plus the raw histogram.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Metric {
    /// `round` (incast round completion), `read` (one READ, post to
    /// completion) or `ctrl_rtt` (control message round trip).
    pub name: String,
    /// Bytes moved per sample.
    pub bytes: u64,
    /// Samples.
    pub iterations: u64,
    /// Minimum, us.
    pub t_min: f64,
    /// Maximum, us.
    pub t_max: f64,
    /// Median, us (perftest's "typical").
    pub t_typical: f64,
    /// Mean, us.
    pub t_avg: f64,
    /// Standard deviation, us.
    pub t_stdev: f64,
    /// 99th percentile, us.
    pub p99: f64,
    /// 99.9th percentile, us.
    pub p99_9: f64,
    /// 99.99th percentile, us.
    pub p99_99: f64,
    /// HdrHistogram V2 compressed + base64, values in `histogram_unit`.
    pub histogram: String,
    /// Unit of the histogram's values ("ns").
    pub histogram_unit: String,
}

impl Metric {
    /// The row under [`COLUMNS`]: sizes as integers, times in µs to 0.01.
    pub(crate) fn cells(&self) -> [String; 10] {
        [
            self.bytes.to_string(),
            self.iterations.to_string(),
            format!("{:.2}", self.t_min),
            format!("{:.2}", self.t_max),
            format!("{:.2}", self.t_typical),
            format!("{:.2}", self.t_avg),
            format!("{:.2}", self.t_stdev),
            format!("{:.2}", self.p99),
            format!("{:.2}", self.p99_9),
            format!("{:.2}", self.p99_99),
        ]
    }
}

/// What was measured, how, and the results (the `--json` / `--save` form).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// Always "netbench".
    pub tool: String,
    /// Format version of this document.
    pub format: u32,
    /// Name of the run in plots.
    pub label: String,
    /// Transport name.
    pub transport: String,
    /// Where it ran (free text: loopback, namespaces + netem, guest ...).
    pub fabric: String,
    /// Peer addresses.
    pub peers: Vec<String>,
    /// Objects per peer.
    pub objects: u32,
    /// Bytes per object.
    pub size: u32,
    /// READs per round.
    pub inputs_per_round: usize,
    /// READs outstanding per peer (None = all at once).
    pub concurrency: Option<usize>,
    /// Measured rounds.
    pub iterations: u64,
    /// Unmeasured rounds before them.
    pub warmup: u64,
    /// READs whose landed bytes were checked.
    pub verified_reads: u64,
    /// Host name of the reader.
    pub host: String,
    /// Seconds since the epoch when the run ended (the reader's clock).
    pub unix_time: u64,
    /// The command line.
    pub command: Vec<String>,
    /// The metrics.
    pub metrics: Vec<Metric>,
}

/// perftest's latency columns (`ib_*_lat`) plus 99.99%, in the order of
/// [`Metric::cells`]; every latency table of netbench prints these.
pub(crate) const COLUMNS: [&str; 10] = [
    "#bytes",
    "#iterations",
    "t_min[usec]",
    "t_max[usec]",
    "t_typical[usec]",
    "t_avg[usec]",
    "t_stdev[usec]",
    "99% percentile[usec]",
    "99.9% percentile[usec]",
    "99.99% percentile[usec]",
];

/// perftest-style table, one row per metric.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let line = "-".repeat(200);
    out.push_str(&line[..160]);
    out.push('\n');
    out.push_str(&format!(
        " netbench: {} | {} | {} peer(s) x {} object(s) x {} B | {} rounds ({} warm-up) | concurrency {} | {} READs verified\n",
        r.transport,
        r.fabric,
        r.peers.len(),
        r.objects,
        r.size,
        r.iterations,
        r.warmup,
        r.concurrency.map_or("all".to_string(), |c| c.to_string()),
        r.verified_reads
    ));
    out.push_str(" round = all READs of one round done; read = one READ, post to completion; ctrl_rtt = control message round trip\n");
    out.push_str(&line[..160]);
    out.push('\n');
    out.push_str(&format!(" {:<9}", "metric"));
    for c in COLUMNS {
        out.push_str(&format!(" {c:>w$}", w = c.len().max(12)));
    }
    out.push('\n');
    for m in &r.metrics {
        out.push_str(&format!(" {:<9}", m.name));
        for (c, v) in COLUMNS.iter().zip(m.cells()) {
            out.push_str(&format!(" {v:>w$}", w = c.len().max(12)));
        }
        out.push('\n');
    }
    out.push_str(&line[..160]);
    out.push('\n');
    out
}

/// CSV with a header line, one row per metric (microseconds).
pub fn csv(r: &Report) -> String {
    let mut out = String::from(
        "transport,metric,bytes,iterations,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p99_us,p99_9_us,p99_99_us\n",
    );
    for m in &r.metrics {
        out.push_str(&format!("{},{},{}\n", r.transport, m.name, m.csv_cells()));
    }
    out
}

impl Metric {
    /// The CSV cells from `bytes` to `p99_99_us` (microseconds, 3 decimals).
    pub fn csv_cells(&self) -> String {
        format!(
            "{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3}",
            self.bytes,
            self.iterations,
            self.t_min,
            self.t_max,
            self.t_typical,
            self.t_avg,
            self.t_stdev,
            self.p99,
            self.p99_9,
            self.p99_99
        )
    }
}

/// This machine's host name (for reports).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Seconds since the epoch.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a unix time (civil-from-days, proleptic Gregorian).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(super::utc(1_795_328_644), "2026-11-22 06:24:04 UTC");
    }

    use super::*;

    #[test]
    fn summary_and_histogram_round_trip() {
        let mut r = Recorder::new();
        for v in 1..=10_000u64 {
            r.record(v * 1000); // 1 us .. 10 ms
        }
        let m = r.summary("round", 64).unwrap();
        assert_eq!(m.iterations, 10_000);
        assert_eq!(m.t_min, 1.0);
        assert_eq!(m.t_max, 10_000.0);
        assert!(
            (m.t_typical - 5000.0).abs() / 5000.0 < 0.002,
            "{}",
            m.t_typical
        );
        assert!((m.p99 - 9900.0).abs() / 9900.0 < 0.002, "{}", m.p99);
        assert!((m.t_avg - 5000.5).abs() < 0.01);
        let h = decode_hist(&m.histogram).unwrap();
        assert_eq!(h.len(), 10_000);
        assert_eq!(h.value_at_quantile(0.5), r.hist().value_at_quantile(0.5));
        assert!(decode_hist("not base64!").is_err());
        assert!(decode_hist("AAAA").is_err());
    }

    #[test]
    fn table_has_perftest_columns() {
        let mut r = Recorder::new();
        r.record(24_000);
        let rep = Report {
            tool: "netbench".into(),
            format: 1,
            label: "x".into(),
            transport: "tcp".into(),
            fabric: "loopback".into(),
            peers: vec!["127.0.0.1:1".into()],
            objects: 1,
            size: 64,
            inputs_per_round: 1,
            concurrency: None,
            iterations: 1,
            warmup: 0,
            verified_reads: 1,
            host: "h".into(),
            unix_time: 0,
            command: vec![],
            metrics: vec![r.summary("read", 64).unwrap()],
        };
        let t = table(&rep);
        for c in COLUMNS {
            assert!(t.contains(c), "{c}");
        }
        assert!(t.contains("24.00"));
        assert!(csv(&rep)
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("tcp,read,64,1,24.000"));
    }
}
