//! The jail driver's integration tests, one binary (`cargo test -p bulkhead-jail --test it`):
//! real sandboxes as root, each test gated with `#[requires(Root, ...)]` (reported as ignored
//! by a plain `cargo test`, failed naming what is missing by `--include-ignored` on a host the
//! jail driver does not support). Every test has a private state dir, uid range and cgroup
//! parent ([`common::Env`]), so they run in parallel in one process.

mod changes;
mod checkpoint;
mod common;
mod conformance;
mod freezer;
mod jail;
mod pulled_image;
mod volumes;
mod zygote;
