//! Sandboxes: the verbs (create, kill, timeout, connect, pause, resume, fork, snapshots,
//! restore, changes, network, metrics, signed URLs, a node drain's evacuation) and the
//! lifecycle state machine
//! (`lifecycle`: which operation may run in which state; `live`: the sandboxes this server drives
//! now, whose state only `LiveSet::enter`/`settle` write).

pub(crate) mod admission;
pub(crate) mod changes;
pub(crate) mod connect;
pub(crate) mod create;
pub(crate) mod evacuate;
pub(crate) mod fork;
pub(crate) mod idempotency;
pub(crate) mod kill;
pub mod lifecycle;
pub(crate) mod live;
pub(crate) mod lookup;
pub(crate) mod metered;
pub(crate) mod metrics;
pub(crate) mod network;
pub(crate) mod pause;
pub(crate) mod restore;
pub(crate) mod resume;
pub(crate) mod signed_urls;
pub(crate) mod snapshots;
pub(crate) mod source;
pub(crate) mod timeout;
