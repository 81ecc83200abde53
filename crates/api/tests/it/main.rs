//! Integration tests of the E2B REST surface and the routing proxy, driven in-process (tower
//! `oneshot`) over the engine with a test double driver: one test binary, one module per area.

mod common;

mod api;
mod console;
mod errors;
mod idempotency;
mod network;
mod openapi;
mod persistence;
mod replicas;
mod volumes;
