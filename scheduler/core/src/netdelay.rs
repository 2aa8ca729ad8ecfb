//! The network delay bound the scheduler charges before a batch can start.
//!
//! `delay(b) = d_ctrl + d_data * b`: one control message to the backend plus
//! the incast fetch of `b` inputs, each at a high percentile. `netbench
//! calibrate` measures both and writes them in the TOML form read here.

use dataplane::time::Duration;
use serde::{Deserialize, Serialize};

/// Linear network delay bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetworkDelay {
    /// Fixed part: the control message to the backend.
    pub d_ctrl: Duration,
    /// Per-input part: fetching one input.
    pub d_data: Duration,
}

impl NetworkDelay {
    /// No network cost (pure scheduling studies).
    pub const ZERO: NetworkDelay = NetworkDelay { d_ctrl: Duration::ZERO, d_data: Duration::ZERO };

    /// `d_ctrl + d_data * b`.
    #[inline]
    pub fn of(&self, b: u32) -> Duration {
        self.d_ctrl + self.d_data.saturating_mul(u64::from(b))
    }

    /// Parses the calibration file format (see [`DelayFile`]).
    pub fn from_toml(text: &str) -> Result<Self, DelayFileError> {
        let f: DelayFile = toml::from_str(text).map_err(DelayFileError::Syntax)?;
        f.to_delay()
    }
}

/// Why a network delay file was refused.
#[derive(Debug, thiserror::Error)]
pub enum DelayFileError {
    /// Not TOML, or fields missing or of the wrong type.
    #[error("bad network delay file: {0}")]
    Syntax(#[source] toml::de::Error),
    /// A bound outside `[0, 1e7]` microseconds.
    #[error("{field} must be between 0 and 1e7 microseconds, got {value}")]
    OutOfRange {
        /// `d_ctrl_us` or `d_data_us`.
        field: &'static str,
        /// The value given.
        value: f64,
    },
}


/// On-disk form of a calibration, as written by `netbench calibrate`.
///
/// ```toml
/// d_ctrl_us = 12.5
/// d_data_us = 3.1
/// percentile = 99.99   # informational
/// fabric = "tcp on loopback"   # informational
/// ```
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DelayFile {
    /// Control-message one-way bound, microseconds.
    pub d_ctrl_us: f64,
    /// Per-input fetch cost, microseconds.
    pub d_data_us: f64,
    /// Percentile the bound was taken at.
    #[serde(default)]
    pub percentile: Option<f64>,
    /// Free-text description of the fabric measured.
    #[serde(default)]
    pub fabric: Option<String>,
}

impl DelayFile {
    /// Validates and converts to a [`NetworkDelay`].
    pub fn to_delay(&self) -> Result<NetworkDelay, DelayFileError> {
        for (field, value) in [("d_ctrl_us", self.d_ctrl_us), ("d_data_us", self.d_data_us)] {
            if !(value.is_finite() && (0.0..=1e7).contains(&value)) {
                return Err(DelayFileError::OutOfRange { field, value });
            }
        }
        Ok(NetworkDelay {
            d_ctrl: Duration::from_secs_f64(self.d_ctrl_us * 1e-6),
            d_data: Duration::from_secs_f64(self.d_data_us * 1e-6),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let d = NetworkDelay::from_toml("d_ctrl_us = 10\nd_data_us = 2.5\npercentile = 99.99\n").unwrap();
        assert_eq!(d.of(4), Duration::from_micros(20));
        assert!(NetworkDelay::from_toml("d_ctrl_us = -1\nd_data_us = 0").is_err());
        assert!(NetworkDelay::from_toml("garbage").is_err());
    }
}
