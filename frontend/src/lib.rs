//! The client-facing side (see docs/architecture.md).
