//! The engine's integration tests, one binary: each module drives a real `Engine` (the fake
//! driver, or the jail where a test needs root) through its public API.

mod bursts;
mod cluster;
mod engine;
mod idempotency;
mod image_gc;
mod network;
mod persistence;
mod pool_source;
mod protocol;
mod replicas;
mod teams;
