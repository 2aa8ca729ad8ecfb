//! The output every executor computes for an input: the shared reference
//! function lives in `dataplane::reference` so that frontends and load
//! generators can verify responses without depending on the backend.

pub use dataplane::reference::{expected_output, OutputHasher};
