//! Tenancy: teams and their keys, quotas, credits and metering math, secrets, and the admission
//! of a create by its team (`admit`) with the per-team state the engine keeps in memory (`state`).

pub(crate) mod admin;
pub(crate) mod admit;
pub mod keys;
pub mod metering;
pub mod quota;
pub(crate) mod secrets;
pub(crate) mod state;
pub(crate) mod team_keys;
pub mod teams;
