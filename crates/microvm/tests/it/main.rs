//! The microvm driver's integration tests, one binary (`cargo test -p bulkhead-microvm --test
//! it`): real QEMU microVMs running the real agent, as root, gated with
//! `#[requires(Root, Qemu, GuestKernel)]`; under TCG where the host has no hardware KVM. Needs
//! `cargo build -p bulkhead-agent` first (the guest runs `target/debug/bulkhead-agent`). Every
//! test has a private state dir and uid range ([`common::Env`]).

mod clone;
mod common;
mod conformance;
mod guest_limits;
mod jailer;
mod vm;
