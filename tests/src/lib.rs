//! Cross-crate test helpers live in the integration tests under `tests/tests/`.
