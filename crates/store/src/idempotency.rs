//! Rows of the `idempotency_keys` table: which create request claimed a team's
//! `Idempotency-Key`, and the sandbox it made. The table is the one place replicas meet, so the
//! claim is a single guarded upsert ([`crate::Store::claim_idempotency_key`]). Times are unix
//! milliseconds the caller gives, as for leases.

use std::time::Duration;

/// One attempt at claiming a key (see [`crate::Store::claim_idempotency_key`]).
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyClaim<'a> {
    /// The caller's team: the key's scope.
    pub team_id: &'a str,
    /// The `Idempotency-Key` header's value.
    pub key: &'a str,
    /// What the request asks for, hashed: the same key with another fingerprint is refused.
    pub fingerprint: &'a str,
    /// Random per attempt; only its holder completes, renews or releases the claim.
    pub token: &'a str,
    pub now_ms: i64,
    /// A pending claim not renewed within this is abandoned, and the next attempt takes it
    /// over.
    pub claim_ttl: Duration,
    /// How long the key is remembered from its claim.
    pub key_ttl: Duration,
}

/// What [`crate::Store::claim_idempotency_key`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The attempt holds the key: it creates, then completes or releases the claim.
    Claimed,
    /// Another attempt with the same request holds the key and has not finished; its claim
    /// lapses at `claim_expires_at` unless renewed.
    InProgress { claim_expires_at: i64 },
    /// An earlier attempt with the same request created this sandbox.
    Completed { sandbox_id: String },
    /// The key was claimed (pending or completed) with a different request.
    Mismatch,
}

/// A key as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRow {
    pub team_id: String,
    pub key: String,
    pub fingerprint: String,
    pub token: String,
    /// None while the create is in flight.
    pub sandbox_id: Option<String>,
    pub created_at: i64,
    pub claim_expires_at: i64,
    pub expires_at: i64,
}
