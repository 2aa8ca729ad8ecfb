//! Model specifications and the paper's model zoo tables.
//!
//! The zoo tables live in `scheduler/core/data/*.csv` (Appendix C of the Symphony
//! paper); they are compiled in with `include_str!` so the binary is
//! self-contained, and any other file of the same format can be loaded at run
//! time with [`parse_zoo_csv`].

use crate::profile::{LatencyProfile, ProfileError};
use dataplane::time::Duration;

/// One servable model: its name, latency profile and SLO.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// Human-readable name, unique within one run.
    pub name: String,
    /// Batch latency profile on the target GPU, capped at the largest batch
    /// that fits the SLO.
    pub profile: LatencyProfile,
    /// Latency objective from arrival to result.
    pub slo: Duration,
}

impl ModelSpec {
    /// A linear-profile model; the profile is tabulated up to the largest
    /// batch whose execution alone fits the SLO.
    pub fn linear(name: &str, alpha_ms: f64, beta_ms: f64, slo_ms: f64) -> Result<Self, ZooError> {
        if !(slo_ms.is_finite() && slo_ms > 0.0) {
            return Err(ZooError::BadSlo { model: name.to_string(), slo_ms });
        }
        let cap = if alpha_ms > 0.0 {
            (((slo_ms - beta_ms) / alpha_ms).floor().max(1.0) as u32).min(crate::profile::DEFAULT_MAX_BATCH)
        } else {
            crate::profile::DEFAULT_MAX_BATCH
        };
        let profile = LatencyProfile::linear(alpha_ms, beta_ms, cap).map_err(|source| ZooError::Profile { model: name.into(), source })?;
        Ok(ModelSpec { name: name.to_string(), profile, slo: Duration::from_millis_f64(slo_ms) })
    }

    /// `beta / alpha`: how strongly the model benefits from batching.
    pub fn batching_ratio(&self) -> f64 {
        match self.profile.linear_coefficients() {
            Some((a, b)) if a > 0.0 => b / a,
            Some(_) => f64::INFINITY,
            None => {
                let l1 = self.profile.latency(1).as_secs_f64();
                let l2 = self.profile.latency(2).as_secs_f64();
                let alpha = l2 - l1;
                if alpha > 0.0 {
                    (l1 - alpha) / alpha
                } else {
                    f64::INFINITY
                }
            }
        }
    }
}

/// Which GPU's zoo table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zoo {
    /// Table 3: NVIDIA 1080Ti, 35 models.
    Gtx1080Ti,
    /// Table 4: NVIDIA A100, 37 models.
    A100,
}

impl Zoo {
    /// Parses `1080ti` or `a100`.
    pub fn parse(s: &str) -> Result<Zoo, ZooError> {
        match s.to_ascii_lowercase().as_str() {
            "1080ti" => Ok(Zoo::Gtx1080Ti),
            "a100" => Ok(Zoo::A100),
            other => Err(ZooError::UnknownZoo { name: other.to_string() }),
        }
    }

    /// The embedded CSV text of this zoo.
    pub fn csv(self) -> &'static str {
        match self {
            Zoo::Gtx1080Ti => include_str!("../data/zoo-1080ti.csv"),
            Zoo::A100 => include_str!("../data/zoo-a100.csv"),
        }
    }

    /// Every model of this zoo.
    pub fn models(self) -> Vec<ModelSpec> {
        // The embedded tables are validated by a unit test, so this cannot fail.
        parse_zoo_csv(self.csv()).unwrap_or_default()
    }
}

/// A subset of a zoo, as the paper's Figure 9 splits it.
#[derive(Clone, Debug, PartialEq)]
pub enum ZooSelection {
    /// Every model.
    All,
    /// Models with `beta/alpha > 2`.
    Strong,
    /// Models with `beta/alpha < 2`.
    Weak,
    /// Models by name (case-insensitive).
    Named(Vec<String>),
}

impl ZooSelection {
    /// Parses `all`, `strong`, `weak` or a comma-separated list of names.
    pub fn parse(s: &str) -> ZooSelection {
        match s.to_ascii_lowercase().as_str() {
            "all" => ZooSelection::All,
            "strong" => ZooSelection::Strong,
            "weak" => ZooSelection::Weak,
            _ => ZooSelection::Named(s.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect()),
        }
    }

    /// Applies the selection.
    pub fn select(&self, models: Vec<ModelSpec>) -> Result<Vec<ModelSpec>, ZooError> {
        Ok(match self {
            ZooSelection::All => models,
            ZooSelection::Strong => models.into_iter().filter(|m| m.batching_ratio() > 2.0).collect(),
            ZooSelection::Weak => models.into_iter().filter(|m| m.batching_ratio() < 2.0).collect(),
            ZooSelection::Named(names) => {
                let mut out = Vec::with_capacity(names.len());
                for n in names {
                    let m = models
                        .iter()
                        .find(|m| m.name.eq_ignore_ascii_case(n))
                        .ok_or_else(|| ZooError::UnknownModel { name: n.clone() })?;
                    out.push(m.clone());
                }
                out
            }
        })
    }
}

/// Errors from parsing model specifications and building a cluster's
/// model list. Each variant names what was given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ZooError {
    /// `--zoo` names no known zoo.
    #[error("unknown zoo '{name}' (expected 1080ti or a100)")]
    UnknownZoo {
        /// The name given.
        name: String,
    },
    /// A selected name is not in the zoo.
    #[error("no model named '{name}' in the zoo")]
    UnknownModel {
        /// The name given.
        name: String,
    },
    /// A model's SLO is not a positive number of milliseconds.
    #[error("{model}: SLO must be > 0 ms, got {slo_ms}")]
    BadSlo {
        /// The model.
        model: String,
        /// The SLO given, ms.
        slo_ms: f64,
    },
    /// A model's profile failed validation.
    #[error("model {model}: {source}")]
    Profile {
        /// The model.
        model: String,
        /// Why.
        source: ProfileError,
    },
    /// A model's fields lack a name.
    #[error("missing name")]
    MissingName,
    /// A model's fields lack a number.
    #[error("missing {field}")]
    MissingField {
        /// `alpha_ms`, `beta_ms` or `slo_ms`.
        field: &'static str,
    },
    /// A model's field is not a number.
    #[error("bad {field} '{value}'")]
    BadNumber {
        /// `alpha_ms`, `beta_ms` or `slo_ms`.
        field: &'static str,
        /// The text given.
        value: String,
    },
    /// A model has more than four fields.
    #[error("too many fields")]
    TooManyFields,
    /// A zoo CSV's first line is not the header.
    #[error("line {line}: expected header name,alpha_ms,beta_ms,slo_ms")]
    BadHeader {
        /// 1-based line.
        line: usize,
    },
    /// A zoo CSV line is wrong.
    #[error("line {line}: {source}")]
    Line {
        /// 1-based line.
        line: usize,
        /// Why.
        source: Box<ZooError>,
    },
    /// `--model` is not `NAME=ALPHA_MS,BETA_MS,SLO_MS`.
    #[error("--model '{arg}': expected NAME=ALPHA_MS,BETA_MS,SLO_MS")]
    ModelArgForm {
        /// The argument given.
        arg: String,
    },
    /// A `--model` argument's fields are wrong.
    #[error("--model '{arg}': {source}")]
    ModelArg {
        /// The argument given.
        arg: String,
        /// Why.
        source: Box<ZooError>,
    },
    /// A flag's value is wrong (`--zoo`, `--models`).
    #[error("{flag}: {source}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// Why.
        source: Box<ZooError>,
    },
    /// Two models share a name.
    #[error("model {name} is listed twice")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// The cluster would have no model.
    #[error("no models: give --models and/or --model NAME=ALPHA_MS,BETA_MS,SLO_MS")]
    NoModels,
    /// More models than one wire message can list.
    #[error("{count} models: at most {max}")]
    TooMany {
        /// Models given.
        count: usize,
        /// The limit.
        max: usize,
    },
}


/// Parses a zoo CSV: `#` comments, a header line `name,alpha_ms,beta_ms,slo_ms`,
/// then one model per line.
pub fn parse_zoo_csv(text: &str) -> Result<Vec<ModelSpec>, ZooError> {
    let mut out = Vec::new();
    let mut saw_header = false;
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !saw_header {
            if line != "name,alpha_ms,beta_ms,slo_ms" {
                return Err(ZooError::BadHeader { line: lineno + 1 });
            }
            saw_header = true;
            continue;
        }
        out.push(parse_model_fields(line.split(',')).map_err(|e| ZooError::Line { line: lineno + 1, source: Box::new(e) })?);
    }
    Ok(out)
}

/// The cluster's model list, which every daemon of one cluster builds the
/// same way from the same flags (model id = index): the `zoo` table's
/// models picked by `selection` (`all`, `strong`, `weak`, names, or `none`),
/// then the `extras` (`NAME=ALPHA_MS,BETA_MS,SLO_MS`). Names must be unique,
/// the list non-empty and short enough for one wire message.
pub fn cluster_models(zoo: &str, selection: &str, extras: &[String]) -> Result<Vec<ModelSpec>, ZooError> {
    let zoo = Zoo::parse(zoo).map_err(|e| ZooError::Flag { flag: "--zoo", source: Box::new(e) })?;
    let mut specs = match selection {
        "none" => Vec::new(),
        sel => ZooSelection::parse(sel)
            .select(zoo.models())
            .map_err(|e| ZooError::Flag { flag: "--models", source: Box::new(e) })?,
    };
    for m in extras {
        specs.push(parse_model_arg(m)?);
    }
    for (i, m) in specs.iter().enumerate() {
        if specs[..i].iter().any(|o| o.name == m.name) {
            return Err(ZooError::Duplicate { name: m.name.clone() });
        }
    }
    if specs.is_empty() {
        return Err(ZooError::NoModels);
    }
    if specs.len() > dataplane::wire::MAX_MODEL_IDS {
        return Err(ZooError::TooMany { count: specs.len(), max: dataplane::wire::MAX_MODEL_IDS });
    }
    Ok(specs)
}

/// Parses `NAME=ALPHA_MS,BETA_MS,SLO_MS` (the CLI's `--model` form).
pub fn parse_model_arg(s: &str) -> Result<ModelSpec, ZooError> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| ZooError::ModelArgForm { arg: s.to_string() })?;
    parse_model_fields(std::iter::once(name).chain(rest.split(',')))
        .map_err(|e| ZooError::ModelArg { arg: s.to_string(), source: Box::new(e) })
}

fn parse_model_fields<'a>(mut fields: impl Iterator<Item = &'a str>) -> Result<ModelSpec, ZooError> {
    let name = fields.next().map(str::trim).filter(|n| !n.is_empty()).ok_or(ZooError::MissingName)?;
    let mut num = |field: &'static str| -> Result<f64, ZooError> {
        let f = fields.next().ok_or(ZooError::MissingField { field })?;
        f.trim().parse::<f64>().map_err(|_| ZooError::BadNumber { field, value: f.trim().to_string() })
    };
    let (alpha, beta, slo) = (num("alpha_ms")?, num("beta_ms")?, num("slo_ms")?);
    if fields.next().is_some() {
        return Err(ZooError::TooManyFields);
    }
    ModelSpec::linear(name, alpha, beta, slo)
}

/// The cluster's model list (model id = index): every daemon of a cluster
/// must be given the same one.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelListArgs {
    /// Model zoo table: a100 or 1080ti.
    #[arg(long, default_value = "a100")]
    pub zoo: String,
    /// Models of the zoo: all, strong, weak, none, or NAME,NAME,...
    #[arg(long, default_value = "all")]
    pub models: String,
    /// Extra model NAME=ALPHA_MS,BETA_MS,SLO_MS, after the zoo's (repeatable).
    #[arg(long)]
    pub model: Vec<String>,
}

impl ModelListArgs {
    /// The flags these are, for a daemon's configuration error.
    pub const FLAGS: &'static str = "zoo, --models, --model";

    /// The model list.
    pub fn resolve(&self) -> Result<Vec<ModelSpec>, ZooError> {
        cluster_models(&self.zoo, &self.models, &self.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_zoos_parse_with_paper_counts() {
        let t = parse_zoo_csv(Zoo::Gtx1080Ti.csv()).unwrap();
        let a = parse_zoo_csv(Zoo::A100.csv()).unwrap();
        assert_eq!((t.len(), a.len()), (35, 37));
        let d = a.iter().find(|m| m.name == "DenseNet121").unwrap();
        assert!((d.batching_ratio() - 195.3).abs() < 0.5);
        assert_eq!(d.slo, Duration::from_millis(21));
        // Every model can run a batch of at least 4 within its SLO (Appendix C).
        for m in t.iter().chain(a.iter()) {
            assert!(m.profile.max_batch_within(m.slo, Duration::ZERO, u32::MAX) >= 4, "{}", m.name);
        }
        let strong = ZooSelection::Strong.select(t.clone()).unwrap();
        let weak = ZooSelection::Weak.select(t.clone()).unwrap();
        assert_eq!(strong.len() + weak.len(), 35);
    }

    #[test]
    fn model_args_and_bad_input() {
        let m = parse_model_arg("resnet=1.053,5.072,25").unwrap();
        assert_eq!(m.profile.max_batch(), 18);
        assert!(parse_model_arg("resnet=1,2").is_err());
        assert!(parse_model_arg("resnet=1,2,x").is_err());
        assert!(parse_model_arg("noequals").is_err());
        assert!(parse_model_arg("m=1,2,0").is_err());
        assert!(parse_zoo_csv("bad header\n").is_err());
        assert!(ZooSelection::parse("ResNet50,nope").select(Zoo::A100.models()).is_err());
        assert_eq!(ZooSelection::parse("resnet50").select(Zoo::A100.models()).unwrap().len(), 1);
    }
}
