//! Several API replicas over one store. Each `bulkhead api` registers in the `replicas` table
//! and heartbeats every second ([`membership`]); a sandbox is driven by one replica, its owner
//! (`sandboxes.owner_replica`, the replica that created it), whose engine alone keeps it in a
//! live set (watcher, TTL, metering, reaper). Any other replica answers a request for it by
//! forwarding the request to the owner ([`route`]), and when the owner's heartbeat is older
//! than [`DEAD_AFTER`], takes it over: a guarded UPDATE gives each sandbox to exactly one
//! taker, which then tracks it as recovery does after a restart ([`takeover`]). The node side
//! never stops, so nothing is restarted or moved.

pub mod membership;
pub mod route;
mod takeover;

use std::time::Duration;

pub use membership::Membership;
pub use route::Route;

/// How often a replica heartbeats, and looks for sandboxes of silent replicas to take.
pub const BEAT: Duration = Duration::from_secs(1);

/// A replica not heard from for this long is gone: its sandboxes are taken over, and its own
/// next heartbeat is refused (it gives up what was taken before registering again).
pub const DEAD_AFTER: Duration = Duration::from_secs(5);

/// Why a replica's registration or heartbeat failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error(
        "could not register API replica {replica} in the store: check that the database is reachable; the replica retries every second"
    )]
    Register {
        replica: String,
        #[source]
        source: bulkhead_store::StoreError,
    },
    #[error(
        "could not record the heartbeat of API replica {replica}: check that the database is reachable; after {DEAD_AFTER:?} without one the other replicas take its sandboxes"
    )]
    Heartbeat {
        replica: String,
        #[source]
        source: bulkhead_store::StoreError,
    },
}
