//! Partitioning instances as the paper's Appendix A.2 builds them: variants
//! of randomly chosen zoo models, each with an independent exponentially
//! distributed request rate; and the model memory they need.

use super::{ModelLoad, PartitionError};
use crate::repository::profile::ProfileFile;
use crate::zoo::Zoo;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use rand_xoshiro::Xoshiro256PlusPlus;

/// One base model's memory.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelMemory {
    /// Model name.
    pub name: String,
    /// Weights, bytes.
    pub static_bytes: u64,
    /// Extra memory of the largest batch, bytes.
    pub dynamic_bytes: u64,
}

const MIB: u64 = 1 << 20;

/// The GPU memory of one backend of `zoo`'s GPU: A100 40 GiB, 1080Ti 11 GiB.
pub fn gpu_memory_bytes(zoo: Zoo) -> u64 {
    match zoo {
        Zoo::A100 => 40 << 30,
        Zoo::Gtx1080Ti => 11 << 30,
    }
}

/// The memory table (`scheduler/data/zoo-memory.csv`: Keras' weight sizes;
/// the dynamic sizes are estimates, see the file's header).
pub fn memory_csv() -> &'static str {
    include_str!("../../data/zoo-memory.csv")
}

/// Parses a memory table: `#` comments, the header
/// `name,static_mib,dynamic_mib`, one model per line.
pub fn parse_memory_csv(text: &str) -> Result<Vec<ModelMemory>, PartitionError> {
    let mut out = Vec::new();
    let mut saw_header = false;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !saw_header {
            if line != "name,static_mib,dynamic_mib" {
                return Err(PartitionError::Invalid(format!("memory table line {}: expected header name,static_mib,dynamic_mib", n + 1)));
            }
            saw_header = true;
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |s: &str| s.parse::<u64>().map_err(|_| PartitionError::Invalid(format!("memory table line {}: bad number '{s}'", n + 1)));
        match f.as_slice() {
            [name, s, d] if !name.is_empty() => out.push(ModelMemory { name: name.to_string(), static_bytes: num(s)? * MIB, dynamic_bytes: num(d)? * MIB }),
            _ => return Err(PartitionError::Invalid(format!("memory table line {}: expected name,static_mib,dynamic_mib", n + 1))),
        }
    }
    Ok(out)
}

/// The models of `zoo` with their memory.
pub fn zoo_memory(zoo: Zoo) -> Result<Vec<ModelMemory>, PartitionError> {
    let table = parse_memory_csv(memory_csv())?;
    zoo.models()
        .iter()
        .map(|m| {
            table
                .iter()
                .find(|t| t.name == m.name)
                .cloned()
                .ok_or_else(|| PartitionError::Invalid(format!("no memory entry for zoo model {}", m.name)))
        })
        .collect()
}

/// The measured memory of a `symphony profile` file: static is the loaded
/// model's resident memory, dynamic the peak while running its largest
/// batch minus that.
pub fn profile_memory(file: &ProfileFile) -> Vec<ModelMemory> {
    file.models
        .iter()
        .map(|m| ModelMemory {
            name: m.name.clone(),
            static_bytes: m.memory_static_bytes,
            dynamic_bytes: m.memory_peak_bytes.saturating_sub(m.memory_static_bytes),
        })
        .collect()
}

/// How to draw an instance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InstanceSpec {
    /// Number of model variants.
    pub models: usize,
    /// Mean request rate of a variant, requests per second.
    pub mean_rate: f64,
    /// Seed of which base model each variant is.
    pub seed: u64,
    /// Seed of the rates (the same models with new rates: a re-partition).
    pub rate_seed: u64,
}

/// `spec.models` variants `NAME#i` of randomly chosen `base` models, with
/// exponential rates.
pub fn generate(base: &[ModelMemory], spec: &InstanceSpec) -> Result<Vec<ModelLoad>, PartitionError> {
    if base.is_empty() {
        return Err(PartitionError::Invalid("no base models".into()));
    }
    let exp = Exp::new(1.0 / spec.mean_rate).map_err(|_| PartitionError::Invalid(format!("mean rate must be > 0, got {}", spec.mean_rate)))?;
    let mut pick = Xoshiro256PlusPlus::seed_from_u64(spec.seed);
    let mut rates = Xoshiro256PlusPlus::seed_from_u64(spec.rate_seed ^ 0x05ee_d0f5_a7e5);
    Ok((0..spec.models)
        .map(|i| {
            let b = &base[pick.random_range(0..base.len())];
            ModelLoad { name: format!("{}#{i}", b.name), rate: exp.sample(&mut rates), static_bytes: b.static_bytes, dynamic_bytes: b.dynamic_bytes }
        })
        .collect())
}
