//! API keys: `e2b_` + 40 lowercase hex (the shape old SDKs validate), stored as SHA-256 only,
//! compared in constant time.

use sha2::{Digest, Sha256};

use crate::ids::random_hex;

pub const KEY_PREFIX: &str = "e2b_";

pub fn generate_key() -> String {
    format!("{KEY_PREFIX}{}", random_hex(20))
}

pub fn is_well_formed(key: &str) -> bool {
    key.len() == KEY_PREFIX.len() + 40
        && key.starts_with(KEY_PREFIX)
        && key[KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The part shown in listings (`e2b_1a2b3c…`).
pub fn display_prefix(key: &str) -> String {
    key.chars().take(KEY_PREFIX.len() + 6).collect()
}

pub use bulkhead_common::constant_time_eq;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_hash_stably() {
        let k = generate_key();
        assert!(is_well_formed(&k), "{k}");
        assert_eq!(hash_key(&k), hash_key(&k));
        assert_ne!(hash_key(&k), hash_key(&generate_key()));
        assert!(!is_well_formed("e2b_XYZ"));
        assert!(!is_well_formed(&k.to_uppercase()));
        assert!(constant_time_eq(&k, &k.clone()));
        assert!(!constant_time_eq(&k, "e2b_"));
    }
}

use bulkhead_store::{ApiKeyRow, DEFAULT_TEAM, Store, StoreError};

use crate::types::{ApiKey, Caller};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "API key must be e2b_ followed by 40 lowercase hex characters (got {0} characters); create one with `bulkhead keys create`"
    )]
    Malformed(usize),
    #[error(
        "Team {0:?} not found: list teams with `bulkhead teams list`, or create it with `bulkhead teams create {0}`"
    )]
    NoTeam(String),
    #[error("Key storage failed")]
    Store(#[from] StoreError),
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn insert(store: &Store, name: &str, key: &str, team: &str) -> Result<ApiKeyRow, KeyError> {
    let team = store
        .get_team(team)
        .await?
        .ok_or_else(|| KeyError::NoTeam(team.to_owned()))?;
    let row = ApiKeyRow {
        id: random_hex(8),
        name: name.to_string(),
        hash: hash_key(key),
        prefix: display_prefix(key),
        created_at: now_ms(),
        revoked_at: None,
        team_id: team.id,
        last_used_at: None,
    };
    store.insert_api_key(&row).await?;
    Ok(row)
}

/// Create a new key in the default team; the plaintext is returned once and never stored.
pub async fn create(store: &Store, name: &str) -> Result<(ApiKey, String), KeyError> {
    create_in(store, name, DEFAULT_TEAM).await
}

/// Create a new key in `team` (id or name); the plaintext is returned once and never stored.
pub async fn create_in(
    store: &Store,
    name: &str,
    team: &str,
) -> Result<(ApiKey, String), KeyError> {
    let key = generate_key();
    Ok((ApiKey::from(&insert(store, name, &key, team).await?), key))
}

/// Every key, revoked ones included.
pub async fn list(store: &Store) -> Result<Vec<ApiKey>, KeyError> {
    Ok(store
        .list_api_keys()
        .await?
        .iter()
        .map(ApiKey::from)
        .collect())
}

/// Revoke the active key with this id or prefix; false when none matches.
pub async fn revoke(store: &Store, id_or_prefix: &str) -> Result<bool, KeyError> {
    Ok(store.revoke_api_key(id_or_prefix).await?)
}

/// Ensure a given key (e.g. from `BULKHEAD_API_KEY`) is accepted, in the default team.
/// Returns true if it was added.
pub async fn seed(store: &Store, key: &str, name: &str) -> Result<bool, KeyError> {
    if !is_well_formed(key) {
        return Err(KeyError::Malformed(key.len()));
    }
    if store
        .find_active_api_key_by_hash(&hash_key(key))
        .await?
        .is_some()
    {
        return Ok(false);
    }
    insert(store, name, key, DEFAULT_TEAM).await?;
    Ok(true)
}

/// The active key matching `key`, if any, as the caller it acts as (its id and team).
pub async fn authenticate(store: &Store, key: &str) -> Result<Option<Caller>, StoreError> {
    if !key.starts_with(KEY_PREFIX) || key.len() > 128 {
        return Ok(None);
    }
    let hash = hash_key(key);
    let row = store.find_active_api_key_by_hash(&hash).await?;
    Ok(row
        .filter(|r| constant_time_eq(&r.hash, &hash))
        .map(|r| ApiKey::from(&r).caller()))
}
