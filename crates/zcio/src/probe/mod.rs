//! Host capability probe.
