//! What runs where the sandboxes are: the isolation driver, checkpoints on disk, the egress
//! network, and the byte streams to each sandbox's agent.

pub mod agent_client;
pub(crate) mod checkpoints;
pub(crate) mod disk_usage;
pub mod driver;
pub(crate) mod guarded;
pub mod network;
