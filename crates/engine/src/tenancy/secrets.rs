//! Secrets: write-only values the egress proxy injects into HTTPS headers; clients see metadata
//! only. Each belongs to a team: every verb works on the caller's team's secrets alone (another
//! team's is 404, whatever its name or id), and a name is unique within a team. The store keeps
//! values sealed with the server's secrets key.

use std::collections::BTreeMap;

use bulkhead_store::{SecretRow, StoreError};

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::node::network;
use crate::types::{Caller, SecretInfo, SecretPage};
use crate::validate::{page_after, page_end, validate_metadata, validate_secret_value};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    pub async fn create_secret(
        &self,
        caller: &Caller,
        name: &str,
        value: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<SecretInfo> {
        network::validate_secret_name(name).map_err(|e| EngineError::BadRequest(e.to_string()))?;
        validate_secret_value(value)?;
        validate_metadata(&metadata)?;
        let now = now_ms();
        let row = SecretRow {
            id: format!("sec_{}", ids::random_hex(12)),
            team_id: caller.team_id.clone(),
            name: name.to_string(),
            version: 1,
            metadata,
            created_at: now,
            updated_at: now,
        };
        self.store
            .insert_secret(&row, value)
            .await
            .map_err(|e| match e {
                StoreError::Conflict { what } => EngineError::Conflict(what),
                e => e.into(),
            })?;
        tracing::info!(secret = %row.id, team = %row.team_id, name = %row.name, "secret created");
        Ok(SecretInfo::from(&row))
    }

    /// By id or name, among the caller's team's secrets.
    pub async fn get_secret(&self, caller: &Caller, id_or_name: &str) -> Result<SecretInfo> {
        self.store
            .get_secret(&caller.team_id, id_or_name)
            .await?
            .map(|r| SecretInfo::from(&r))
            .ok_or_else(|| EngineError::SecretNotFound(id_or_name.to_string()))
    }

    pub async fn update_secret(
        &self,
        caller: &Caller,
        id_or_name: &str,
        value: &str,
        metadata: Option<BTreeMap<String, String>>,
    ) -> Result<SecretInfo> {
        validate_secret_value(value)?;
        if let Some(md) = &metadata {
            validate_metadata(md)?;
        }
        let row = self
            .store
            .update_secret(
                &caller.team_id,
                id_or_name,
                value,
                metadata.as_ref(),
                now_ms(),
            )
            .await?
            .ok_or_else(|| EngineError::SecretNotFound(id_or_name.to_string()))?;
        tracing::info!(secret = %row.id, team = %row.team_id, version = row.version, "secret updated");
        Ok(SecretInfo::from(&row))
    }

    /// Delete one of the caller's team's secrets by id or name.
    pub async fn delete_secret(&self, caller: &Caller, id_or_name: &str) -> Result<()> {
        if self
            .store
            .delete_secret(&caller.team_id, id_or_name)
            .await?
        {
            tracing::info!(secret = %id_or_name, team = %caller.team_id, "secret deleted");
            Ok(())
        } else {
            Err(EngineError::SecretNotFound(id_or_name.to_string()))
        }
    }

    /// The caller's team's secrets, oldest first, a page at a time.
    pub async fn list_secrets(
        &self,
        caller: &Caller,
        limit: Option<usize>,
        next_token: Option<&str>,
    ) -> Result<SecretPage> {
        let limit = limit.unwrap_or(100).clamp(1, 100);
        let after = page_after(next_token)?;
        let mut rows = self
            .store
            .list_secrets(&caller.team_id, limit as i64 + 1, after)
            .await?;
        let next_token = page_end(&mut rows, limit, |r| (r.created_at, &r.id));
        Ok(SecretPage {
            items: rows.iter().map(SecretInfo::from).collect(),
            next_token,
        })
    }
}
