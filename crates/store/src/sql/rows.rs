//! Row mappers: the columns each table is read with, and the conversion of a row into the
//! store's public row types (JSON maps decoded, integer booleans, states parsed).

use std::collections::BTreeMap;

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{ApiKeyRow, EgressEventRow, Result, SandboxRow, SandboxState, StoreError, TemplateRow};

pub(super) const SANDBOX_COLUMNS: &str = "id, template_id, alias, state, owner_key_id, \
     team_id, metadata, env_vars, envd_access_token, cpu_count, memory_mb, disk_size_mb, started_at, \
     end_at, driver_handle, end_reason, allow_internet, network, node_id, owner_replica";

pub(super) const EGRESS_EVENT_COLUMNS: &str =
    "sandbox_id, at, protocol, host, ip, port, allowed, rule, bytes_out, bytes_in";

pub(super) const TEMPLATE_COLUMNS: &str = "id, alias, content_hash, status, rootfs_path, \
     cpu_count, memory_mb, disk_size_mb, created_at, updated_at, team_id";

pub(super) const API_KEY_COLUMNS: &str =
    "id, name, hash, prefix, created_at, revoked_at, team_id, last_used_at";

pub(super) fn to_json(map: &BTreeMap<String, String>) -> String {
    // A map of strings always serialises.
    serde_json::to_string(map).unwrap_or_else(|_| "{}".to_owned())
}

pub(super) fn from_json(text: &str, id: &str, column: &str) -> Result<BTreeMap<String, String>> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!(
            "sandbox {id}: column {column} is not a JSON string map: {e}"
        ))
    })
}

pub(super) fn api_key_from_row(row: &AnyRow) -> Result<ApiKeyRow> {
    Ok(ApiKeyRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        hash: row.try_get("hash")?,
        prefix: row.try_get("prefix")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
        team_id: row.try_get("team_id")?,
        last_used_at: row.try_get("last_used_at")?,
    })
}

pub(super) fn sandbox_from_row(row: &AnyRow) -> Result<SandboxRow> {
    let id: String = row.try_get("id")?;
    let state: String = row.try_get("state")?;
    let state = SandboxState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("sandbox {id}: unknown state {state:?}")))?;
    let metadata = from_json(&row.try_get::<String, _>("metadata")?, &id, "metadata")?;
    let env_vars = from_json(&row.try_get::<String, _>("env_vars")?, &id, "env_vars")?;
    Ok(SandboxRow {
        template_id: row.try_get("template_id")?,
        alias: row.try_get("alias")?,
        state,
        owner_key_id: row.try_get("owner_key_id")?,
        team_id: row.try_get("team_id")?,
        metadata,
        env_vars,
        envd_access_token: row.try_get("envd_access_token")?,
        cpu_count: row.try_get("cpu_count")?,
        memory_mb: row.try_get("memory_mb")?,
        disk_size_mb: row.try_get("disk_size_mb")?,
        started_at: row.try_get("started_at")?,
        end_at: row.try_get("end_at")?,
        driver_handle: row.try_get("driver_handle")?,
        end_reason: row.try_get("end_reason")?,
        allow_internet: row.try_get::<i64, _>("allow_internet")? != 0,
        network: row.try_get("network")?,
        node_id: row.try_get("node_id")?,
        owner_replica: row.try_get("owner_replica")?,
        id,
    })
}

pub(super) fn egress_event_from_row(row: &AnyRow) -> Result<EgressEventRow> {
    Ok(EgressEventRow {
        sandbox_id: row.try_get("sandbox_id")?,
        at: row.try_get("at")?,
        protocol: row.try_get("protocol")?,
        host: row.try_get("host")?,
        ip: row.try_get("ip")?,
        port: row.try_get("port")?,
        allowed: row.try_get::<i64, _>("allowed")? != 0,
        rule: row.try_get("rule")?,
        bytes_out: row.try_get("bytes_out")?,
        bytes_in: row.try_get("bytes_in")?,
    })
}

pub(super) fn template_from_row(row: &AnyRow) -> Result<TemplateRow> {
    Ok(TemplateRow {
        id: row.try_get("id")?,
        alias: row.try_get("alias")?,
        content_hash: row.try_get("content_hash")?,
        status: row.try_get("status")?,
        rootfs_path: row.try_get("rootfs_path")?,
        cpu_count: row.try_get("cpu_count")?,
        memory_mb: row.try_get("memory_mb")?,
        disk_size_mb: row.try_get("disk_size_mb")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        team_id: row.try_get("team_id")?,
    })
}
