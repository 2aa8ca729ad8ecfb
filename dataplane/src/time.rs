//! Monotonic time as integer nanoseconds.
//!
//! Every scheduling decision is made on [`Instant`]s of one process's own
//! monotonic clock; nothing here is ever compared across machines. Messages
//! carry [`Duration`]s (remaining budgets) instead, and the receiver turns them
//! back into its own instants.

use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

/// A span of time in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub u64);

/// A point on one process's monotonic clock, in nanoseconds since an arbitrary
/// origin (the simulator's zero, or the runtime's start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Duration {
    /// Zero length.
    pub const ZERO: Duration = Duration(0);
    /// The longest representable span.
    pub const MAX: Duration = Duration(u64::MAX);

    /// From nanoseconds.
    pub const fn from_nanos(ns: u64) -> Self {
        Duration(ns)
    }
    /// From microseconds.
    pub const fn from_micros(us: u64) -> Self {
        Duration(us * 1_000)
    }
    /// From milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Duration(ms * 1_000_000)
    }
    /// From fractional milliseconds, rounded to the nearest nanosecond;
    /// negative and non-finite inputs become zero.
    pub fn from_millis_f64(ms: f64) -> Self {
        Self::from_secs_f64(ms / 1e3)
    }
    /// From fractional seconds, rounded to the nearest nanosecond; negative
    /// and non-finite inputs become zero, huge ones saturate.
    pub fn from_secs_f64(s: f64) -> Self {
        if !s.is_finite() || s <= 0.0 {
            return Duration(0);
        }
        let ns = (s * 1e9).round();
        if ns >= u64::MAX as f64 {
            Duration(u64::MAX)
        } else {
            Duration(ns as u64)
        }
    }
    /// Nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Fractional milliseconds.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    /// Fractional seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// `self - rhs`, or zero when `rhs` is longer.
    pub const fn saturating_sub(self, rhs: Duration) -> Duration {
        Duration(self.0.saturating_sub(rhs.0))
    }
    /// `self + rhs`, saturating at [`Duration::MAX`].
    pub const fn saturating_add(self, rhs: Duration) -> Duration {
        Duration(self.0.saturating_add(rhs.0))
    }
    /// `self * k`, saturating.
    pub const fn saturating_mul(self, k: u64) -> Duration {
        Duration(self.0.saturating_mul(k))
    }
}

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant(0);
    /// Later than every real instant; used for "never" and "busy forever".
    pub const NEVER: Instant = Instant(u64::MAX);

    /// From nanoseconds since the origin.
    pub const fn from_nanos(ns: u64) -> Self {
        Instant(ns)
    }
    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Fractional milliseconds since the origin.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    /// Time from `earlier` to `self`, or zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
    /// `self - d`, clamped at the origin.
    pub const fn saturating_sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(d.0))
    }
    /// `self + d`, saturating at [`Instant::NEVER`].
    pub const fn saturating_add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}
impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}
impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        self.saturating_sub(rhs)
    }
}
impl SubAssign<Duration> for Instant {
    fn sub_assign(&mut self, rhs: Duration) {
        *self = *self - rhs;
    }
}
impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        self.saturating_add(rhs)
    }
}
impl AddAssign for Duration {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}
impl Sub for Duration {
    type Output = Duration;
    fn sub(self, rhs: Duration) -> Duration {
        self.saturating_sub(rhs)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}ms", self.as_millis_f64())
    }
}
impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:.3}ms", self.as_millis_f64())
    }
}

/// The process's monotonic clock, as an [`Instant`] since a chosen origin.
///
/// Only the live runtime and the daemons read it; scheduling cores are handed
/// `now` explicitly.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: std::time::Instant,
}

impl MonotonicClock {
    /// A clock whose origin is this moment.
    pub fn new() -> Self {
        MonotonicClock { origin: std::time::Instant::now() }
    }
    /// This host's `CLOCK_MONOTONIC` reading at the origin, ns: what turns
    /// this clock's instants into readings another process of the same
    /// host can compare (benchmarks only, see [`host_monotonic_ns`]).
    pub fn origin_host_ns(&self) -> u64 {
        host_monotonic_ns().saturating_sub(self.now().as_nanos())
    }
    /// Time since the origin.
    pub fn now(&self) -> Instant {
        let ns = self.origin.elapsed().as_nanos();
        Instant(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// This host's `CLOCK_MONOTONIC`, ns: shared by every process of one
/// machine, so benchmarks may compare readings across processes of one
/// host. Nothing in production compares clocks across processes.
pub fn host_monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        assert_eq!(Instant(5) - Duration(10), Instant::ZERO);
        assert_eq!(Instant::NEVER + Duration(1), Instant::NEVER);
        assert_eq!(Instant(10).saturating_since(Instant(20)), Duration::ZERO);
        assert_eq!(Duration::from_millis_f64(1.0535), Duration(1_053_500));
        assert_eq!(Duration::from_millis_f64(-3.0), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(f64::NAN), Duration::ZERO);
    }
}
