//! E2B Template API response shapes (field names exactly as the SDKs' generated models read
//! them: `e2b/api/client/models/template_*.py`).

use serde::Serialize;
use utoipa::ToSchema;

/// `TemplateRequestResponseV3` (POST /v3/templates).
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateRequestResponseV3 {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub aliases: Vec<String>,
    pub tags: Vec<String>,
}

/// `TemplateBuildFileUpload`: `url` is set when the archive is not present yet.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateBuildFileUpload {
    pub present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// `BuildLogEntry`.
#[derive(Debug, Serialize, ToSchema)]
pub struct BuildLogEntry {
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub timestamp: String,
    pub message: String,
    /// `debug`, `info`, `warn` or `error`.
    #[schema(example = "info")]
    pub level: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// `BuildStatusReason`: why a build failed.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatusReason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub log_entries: Vec<BuildLogEntry>,
}

/// `TemplateBuildInfo` (GET /templates/{id}/builds/{build}/status).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// `waiting`, `building`, `ready` or `error`.
    #[schema(example = "building")]
    pub status: String,
    pub logs: Vec<String>,
    pub log_entries: Vec<BuildLogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildStatusReason>,
}

/// `TemplateAliasResponse`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateAliasResponse {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
}

/// `AssignedTemplateTags`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssignedTemplateTags {
    #[serde(rename = "buildID")]
    #[schema(format = Uuid)]
    pub build_id: String,
    pub tags: Vec<String>,
}

/// `TemplateTag`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateTag {
    pub tag: String,
    #[serde(rename = "buildID")]
    #[schema(format = Uuid)]
    pub build_id: String,
    /// RFC 3339.
    #[serde(rename = "createdAt")]
    #[schema(format = DateTime)]
    pub created_at: String,
}
