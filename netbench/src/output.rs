//! What a run leaves: its JSON report, the table or CSV on stdout, and
//! percentile plots of saved reports (`netbench plot`).

use crate::args::{Output, PlotArgs};
use crate::client::{BenchConfig, RunResult};
use crate::fail::{Fail, Res};
use crate::stats::{self, Report};
use crate::transport::TransportKind;
use crate::plot;

pub(crate) fn report(
    kind: TransportKind,
    fabric: String,
    label: Option<String>,
    addrs: Vec<String>,
    cfg: &BenchConfig,
    inputs: usize,
    r: &RunResult,
) -> Res<Report> {
    let size = u64::from(cfg.size);
    let label = label.unwrap_or_else(|| {
        format!(
            "{} {}x{}x{}B",
            kind.name(),
            addrs.len(),
            cfg.objects,
            cfg.size
        )
    });
    Ok(Report {
        tool: "netbench".to_string(),
        format: 1,
        label,
        transport: kind.name().to_string(),
        fabric,
        peers: addrs,
        objects: cfg.objects,
        size: cfg.size,
        inputs_per_round: inputs,
        concurrency: cfg.concurrency,
        iterations: cfg.iters,
        warmup: cfg.warmup,
        verified_reads: r.verified,
        host: stats::hostname(),
        unix_time: stats::unix_time(),
        command: std::env::args().collect(),
        metrics: vec![
            r.round.summary("round", inputs as u64 * size)?,
            r.read.summary("read", size)?,
            r.ctrl.summary("ctrl_rtt", cfg.ping_size as u64)?,
        ],
    })
}

pub(crate) fn emit(rep: &Report, out: &Output) -> Res<()> {
    let json = serde_json::to_string_pretty(rep)?;
    out.form.save(&json)?;
    if let Some(p) = &out.plot {
        let panels = panels_of(std::slice::from_ref(rep), &[])?;
        let svg = plot::svg(&format!("netbench: {}", rep.label), &panels, true);
        std::fs::write(p, svg)
            .map_err(Fail::write(p.clone()))?;
    }
    out.form.print(&json, || stats::table(rep), || stats::csv(rep));
    Ok(())
}

const METRIC_TITLES: [(&str, &str); 3] = [
    ("round", "incast round (all READs of a batch)"),
    ("read", "one READ, post to completion"),
    ("ctrl_rtt", "control message round trip"),
];

fn panels_of(reports: &[Report], wanted: &[String]) -> Res<Vec<plot::Panel>> {
    let names: Vec<String> = if wanted.is_empty() {
        let mut v: Vec<String> = Vec::new();
        for r in reports {
            for m in &r.metrics {
                if !v.contains(&m.name) {
                    v.push(m.name.clone());
                }
            }
        }
        v
    } else {
        wanted.to_vec()
    };
    let mut panels = Vec::new();
    for name in names {
        let mut series = Vec::new();
        for r in reports {
            if let Some(m) = r.metrics.iter().find(|m| m.name == name) {
                if m.histogram_unit != "ns" {
                    return Err(Fail::runtime(format!(
                        "{}: histogram unit {:?} (expected ns)",
                        r.label, m.histogram_unit
                    )));
                }
                series.push(plot::Series {
                    label: r.label.clone(),
                    hist: stats::decode_hist(&m.histogram)?,
                });
            }
        }
        if series.is_empty() {
            return Err(Fail::usage(format!(
                "no report has a metric named {name:?} (round, read, ctrl_rtt)"
            )));
        }
        let title = METRIC_TITLES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(name.clone(), |(n, t)| format!("{n}: {t}"));
        panels.push(plot::Panel { title, series });
    }
    Ok(panels)
}

pub(crate) fn cmd_plot(a: PlotArgs) -> Res<()> {
    let mut reports = Vec::new();
    for f in &a.files {
        let text = std::fs::read_to_string(f)
            .map_err(Fail::read(f.clone()))?;
        let r: Report = serde_json::from_str(&text).map_err(Fail::caused(format!("{} is not a netbench JSON report", f.display())))?;
        reports.push(r);
    }
    let panels = panels_of(&reports, &a.metric)?;
    let svg = plot::svg(a.title.as_deref().unwrap_or("netbench: latency by percentile"), &panels, !a.linear_y);
    std::fs::write(&a.out, svg)
        .map_err(Fail::write(a.out.clone()))?;
    tracing::info!(
        "wrote {} ({} panel(s), {} run(s))",
        a.out.display(),
        panels.len(),
        reports.len()
    );
    Ok(())
}
