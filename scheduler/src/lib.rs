//! Scheduling policy (see docs/architecture.md).
