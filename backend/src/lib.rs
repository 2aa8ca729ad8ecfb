//! The GPU worker (see docs/architecture.md).
