//! Idempotent creates (issue 25): a create carrying an `Idempotency-Key` makes at most one
//! sandbox per (team, key), whichever API replica each attempt reaches, so a client may retry a
//! create whose answer it lost without making a second sandbox.
//!
//! The key lives in the store (`idempotency_keys`), the one thing replicas share. An attempt:
//! 1. checks the key (1 to 255 visible ASCII characters: [`validate_key`]) and fingerprints
//!    the request ([`fingerprint`]: a hash of what it asks for, after defaults);
//! 2. claims the key with one guarded upsert ([`bulkhead_store::Store::claim_idempotency_key`]):
//!    exactly one of the attempts racing for a key wins;
//! 3. the winner creates as [`Engine::create`] does, renewing its claim while the create runs
//!    (so a slow create keeps it, and a replica that died mid-create loses it within
//!    [`Timing::claim_ttl`]), then records the sandbox's id under the key, or, when the create
//!    failed, deletes the claim so that a retry with the key creates again;
//! 4. an attempt that finds the key held by the same request waits (polling the claim, at most
//!    [`Timing::wait`]) and then answers as the winner did: the same sandbox, in the same 201
//!    create answer (same `sandboxID`, same `envdAccessToken`). If the winner failed, the
//!    waiter's next poll claims the key and creates itself, as a retry would.
//!
//! What the other answers are, and why:
//! - the key with a different request: [`IdempotencyError::Mismatch`], a 422, as the IETF
//!   draft "The Idempotency-Key HTTP Header Field" asks (Stripe answers 400; 409 is kept for
//!   the two cases below, where the same request may succeed later or never);
//! - still in flight after the wait: [`IdempotencyError::InProgress`], a 409 (the draft's
//!   answer to a concurrent request): retrying with the same key later gets the sandbox;
//! - a later attempt after success gets the sandbox again while it exists (running or paused;
//!   Stripe replays the original answer too). Once it has ended (killed, timed out, deleted)
//!   replaying its create would hand out a sandbox that cannot be used, so the answer is
//!   [`IdempotencyError::Ended`], a 409 that names the sandbox and says to use a new key.
//!
//! Keys are remembered for [`Timing::key_ttl`] (24 h) from their claim; expired rows are
//! deleted by the next keyed create (and an expired key is claimable before that).

use std::sync::Arc;
use std::time::Duration;

use bulkhead_store::{ClaimOutcome, IdempotencyClaim, SandboxState};
use sha2::{Digest, Sha256};

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::{EngineError, IdempotencyError};
use crate::ids;
use crate::types::{Caller, CreateRequest, SandboxInfo};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The longest key accepted (Stripe's limit too).
pub const MAX_KEY_LEN: usize = 255;

/// The clock of idempotent creates (one value, so tests can read what the server uses).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// How long a key is remembered from its claim.
    pub key_ttl: Duration,
    /// A claim not renewed within this is abandoned (its replica died mid-create) and the next
    /// attempt with the key takes it over.
    pub claim_ttl: Duration,
    /// How often the winner renews its claim while it creates (well within `claim_ttl`).
    pub renew_every: Duration,
    /// How long an attempt waits for another one's create with the same key before answering
    /// 409: longer than a create normally takes (queue, start, a template's ready check).
    pub wait: Duration,
    /// The first pause between polls; it doubles up to `poll_max`.
    pub poll_first: Duration,
    pub poll_max: Duration,
}

pub(crate) const TIMING: Timing = Timing {
    key_ttl: Duration::from_secs(24 * 3600),
    claim_ttl: Duration::from_secs(60),
    renew_every: Duration::from_secs(20),
    wait: Duration::from_secs(300),
    poll_first: Duration::from_millis(20),
    poll_max: Duration::from_secs(1),
};

/// Checks an `Idempotency-Key`: 1 to [`MAX_KEY_LEN`] visible ASCII characters (`!` to `~`).
pub fn validate_key(key: &str) -> Result<(), IdempotencyError> {
    let reason = if key.is_empty() {
        "it is empty".to_owned()
    } else if let Some(c) = key.chars().find(|c| !c.is_ascii_graphic()) {
        format!("it contains {c:?}, which is not a visible ASCII character")
    } else if key.len() > MAX_KEY_LEN {
        format!("it is {} characters long", key.len())
    } else {
        return Ok(());
    };
    Err(IdempotencyError::InvalidKey { reason })
}

/// What `req` asks for, as a hex SHA-256 of a canonical JSON form with the server's defaults
/// applied (an absent `timeout` and an explicit default one are the same request; map order
/// and JSON spelling never matter, the front end parsed them). Env vars are part of it, so only
/// the hash is stored. Prefixed with a version: a later change of the form makes old keys
/// mismatch instead of silently matching something else.
pub(crate) fn fingerprint(
    req: &CreateRequest,
    default_timeout: Duration,
    default_allow_internet: bool,
) -> String {
    let mounts: Vec<[&str; 2]> = req
        .volume_mounts
        .iter()
        .map(|m| [m.name.as_str(), m.path.as_str()])
        .collect();
    let canonical = serde_json::json!({
        "template": if req.template.is_empty() { "base" } else { req.template.as_str() },
        "timeout": req.timeout.unwrap_or(default_timeout.as_secs()),
        "metadata": req.metadata,
        "envVars": req.env_vars,
        // The only difference between the v1 and v2 creates.
        "secure": req.is_secure(),
        "allowInternetAccess": req.allow_internet_access.unwrap_or(default_allow_internet),
        "network": req.network,
        "volumeMounts": mounts,
        "lifecycle": req.lifecycle,
    });
    format!(
        "v1:{}",
        hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
    )
}

impl Engine {
    /// Create a sandbox at most once per (caller's team, `key`): see the module's doc. The
    /// answer of every attempt with the same key and request is the first success's sandbox.
    pub async fn create_idempotent(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
        key: &str,
    ) -> Result<SandboxInfo> {
        self.create_keyed(caller, req, key, TIMING).await
    }

    pub(crate) async fn create_keyed(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
        key: &str,
        timing: Timing,
    ) -> Result<SandboxInfo> {
        validate_key(key)?;
        let fingerprint = fingerprint(
            &req,
            self.cfg.default_timeout,
            self.cfg.network_default_allow,
        );
        // Opportunistic cleanup; a failure only leaves expired rows for the next create.
        if let Err(e) = self.store.delete_expired_idempotency_keys(now_ms()).await {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "expired idempotency keys not deleted"
            );
        }
        let token = ids::random_hex(16);
        let started = tokio::time::Instant::now();
        let mut pause = timing.poll_first;
        loop {
            let claim = IdempotencyClaim {
                team_id: &caller.team_id,
                key,
                fingerprint: &fingerprint,
                token: &token,
                now_ms: now_ms(),
                claim_ttl: timing.claim_ttl,
                key_ttl: timing.key_ttl,
            };
            match self.store.claim_idempotency_key(&claim).await? {
                ClaimOutcome::Claimed => {
                    return self.create_claimed(caller, req, key, token, timing).await;
                }
                ClaimOutcome::Completed { sandbox_id } => {
                    return self.replay(caller, key, &sandbox_id).await;
                }
                ClaimOutcome::Mismatch => {
                    return Err(IdempotencyError::Mismatch { key: key.into() }.into());
                }
                ClaimOutcome::InProgress { .. } => {
                    let waited = started.elapsed();
                    if waited + pause > timing.wait {
                        return Err(IdempotencyError::InProgress {
                            key: key.into(),
                            waited_secs: waited.as_secs(),
                        }
                        .into());
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(timing.poll_max);
                }
            }
        }
    }

    /// The winner's create, in its own task: a client that goes away mid-create neither leaves
    /// the claim pending (it would lapse and a retry would make a second sandbox) nor loses
    /// the record of the sandbox.
    async fn create_claimed(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
        key: &str,
        token: String,
        timing: Timing,
    ) -> Result<SandboxInfo> {
        let engine = Arc::clone(self);
        let (caller, key) = (caller.clone(), key.to_owned());
        let work = bulkhead_common::request_id::propagate(async move {
            let team = caller.team_id.as_str();
            let created = engine.create(&caller, req);
            tokio::pin!(created);
            let mut renew = tokio::time::interval_at(
                tokio::time::Instant::now() + timing.renew_every,
                timing.renew_every,
            );
            let result = loop {
                tokio::select! {
                    r = &mut created => break r,
                    _ = renew.tick() => {
                        let until = now_ms().saturating_add(timing.claim_ttl.as_millis() as i64);
                        match engine.store.renew_idempotency_claim(team, &key, &token, until).await {
                            Ok(true) => {}
                            Ok(false) => tracing::warn!(key = %key, "idempotency claim lapsed mid-create: a retry with the key may create another sandbox"),
                            Err(e) => tracing::warn!(key = %key, error = &e as &dyn std::error::Error, "idempotency claim not renewed"),
                        }
                    }
                }
            };
            match &result {
                Ok(info) => {
                    match engine
                        .store
                        .complete_idempotency_key(team, &key, &token, &info.id)
                        .await
                    {
                        Ok(true) => {}
                        // The sandbox exists and is the caller's; only the key lost track of
                        // it (its claim lapsed and another attempt took the key over).
                        Ok(false) => {
                            tracing::warn!(key = %key, sandbox = %info.id, "idempotency claim lost before the create finished: the key does not name this sandbox")
                        }
                        Err(e) => {
                            tracing::warn!(key = %key, sandbox = %info.id, error = &e as &dyn std::error::Error, "idempotency key not completed: it lapses and a retry with it creates again")
                        }
                    }
                }
                Err(_) => {
                    if let Err(e) = engine
                        .store
                        .release_idempotency_key(team, &key, &token)
                        .await
                    {
                        tracing::warn!(key = %key, error = &e as &dyn std::error::Error, "idempotency claim not released: it lapses after its claim TTL");
                    }
                }
            }
            result
        });
        match tokio::spawn(tracing::Instrument::in_current_span(work)).await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The answer of a key that already made `sandbox_id`: its create answer again while it
    /// exists.
    async fn replay(&self, caller: &Caller, key: &str, sandbox_id: &str) -> Result<SandboxInfo> {
        let row = self.store.get_sandbox(sandbox_id).await?;
        match row {
            Some(row)
                if row.team_id == caller.team_id
                    && !matches!(row.state, SandboxState::Dead | SandboxState::Killing) =>
            {
                tracing::debug!(key = %key, sandbox = %sandbox_id, "idempotent create answered with its sandbox");
                Ok(self.info_from_row(&row))
            }
            _ => Err(IdempotencyError::Ended {
                key: key.into(),
                sandbox_id: sandbox_id.into(),
            }
            .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::types::MountRequest;

    #[test]
    fn keys_are_1_to_255_visible_ascii_characters() {
        for ok in [
            "a",
            "0b7c1f2e-3d4a-4b5c-8d9e-0f1a2b3c4d5e",
            "~!#$%&'*+-.^_`|",
            &"k".repeat(255),
        ] {
            assert!(validate_key(ok).is_ok(), "{ok:?}");
        }
        for (bad, why) in [
            ("", "it is empty"),
            ("a b", "' '"),
            ("tab\there", "'\\t'"),
            ("naïve", "'ï'"),
            ("nul\0", "'\\0'"),
        ] {
            let e = validate_key(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert!(e.contains("1 to 255 visible ASCII characters"), "{e}");
        }
        let e = validate_key(&"k".repeat(256)).unwrap_err().to_string();
        assert!(e.contains("it is 256 characters long"), "{e}");
    }

    #[test]
    fn the_fingerprint_is_what_the_request_asks_for_after_defaults() {
        let default = Duration::from_secs(300);
        let fp = |r: &CreateRequest| fingerprint(r, default, false);
        let base = CreateRequest {
            template: "base".into(),
            ..Default::default()
        };
        let same = [
            CreateRequest {
                template: String::new(),
                ..base.clone()
            },
            CreateRequest {
                timeout: Some(300),
                ..base.clone()
            },
            CreateRequest {
                secure: Some(true),
                ..base.clone()
            },
            CreateRequest {
                allow_internet_access: Some(false),
                ..base.clone()
            },
        ];
        for r in &same {
            assert_eq!(fp(r), fp(&base), "{r:?}");
        }
        let mut env = base.clone();
        env.env_vars.insert("A".into(), "1".into());
        let mut env2 = base.clone();
        env2.env_vars.insert("A".into(), "2".into());
        let mut meta = base.clone();
        meta.metadata.insert("A".into(), "1".into());
        let mut lifecycle = base.clone();
        lifecycle.lifecycle.auto_resume = !lifecycle.lifecycle.auto_resume;
        let different = [
            CreateRequest {
                template: "other".into(),
                ..base.clone()
            },
            CreateRequest {
                timeout: Some(301),
                ..base.clone()
            },
            CreateRequest {
                secure: Some(false),
                ..base.clone()
            },
            CreateRequest {
                allow_internet_access: Some(true),
                ..base.clone()
            },
            CreateRequest {
                volume_mounts: vec![MountRequest {
                    name: "v".into(),
                    path: "/mnt".into(),
                }],
                ..base.clone()
            },
            env,
            env2,
            meta,
            lifecycle,
        ];
        let mut seen = std::collections::BTreeSet::from([fp(&base)]);
        for r in &different {
            assert!(seen.insert(fp(r)), "{r:?} has a fingerprint seen before");
        }
        assert!(fp(&base).starts_with("v1:"));
        // Metadata is not env vars.
        assert_ne!(fp(&different[5]), fp(&different[7]));
    }
}
