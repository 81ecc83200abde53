//! [`JailDriver`]: the `Driver` implementation. Runs inside the multi-threaded server, so every
//! step that needs `clone` goes through the launcher process.
//!
//! Modules, leaves first (each imports only modules above it; none imports this one):
//!
//! - [`fsutil`], [`pidfd`], [`agent_sock`]: helpers (directories and disk usage, verified
//!   pidfds, the agent's socket and log tail);
//! - [`launch`]: launcher I/O and its [`LaunchError`];
//! - [`ca`], [`resolv`]: the sandbox's CA bundle and `/etc/resolv.conf`;
//! - [`state`]: the driver, its slot table and the sandboxes it owns;
//! - [`setup`]: making a driver; [`lowers`]: the idmapped template views;
//! - [`watch`]: owning a running sandbox (pidfd, reaper) and waiting for its death;
//! - [`teardown`]: killing a sandbox and removing what it held;
//! - [`freeze`]: freeze and thaw through the cgroup freezer;
//! - [`disk`]: a sandbox's own filesystem for its changes (size and inode limits);
//! - [`manifest`]: a checkpoint directory's layout; [`seed`]: a slot's disk, blank or from one;
//! - [`start`]: a slot's start as one pipeline;
//! - [`checkpoint`], [`restore`]: pause/snapshot and restore with CRIU; [`export`]: a
//!   sandbox's changes for template builds;
//! - [`imp`]: the `Driver` trait over all of the above.

mod agent_sock;
mod ca;
mod changes;
mod checkpoint;
mod disk;
mod export;
mod freeze;
mod fsutil;
mod imp;
mod launch;
mod lowers;
mod manifest;
mod pidfd;
mod resolv;
mod restore;
mod seed;
mod setup;
mod start;
mod state;
mod teardown;
mod watch;

pub use launch::LaunchError;
pub use state::JailDriver;
