//! Simulated fabric (in progress).
