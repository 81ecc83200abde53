//! Custom templates built through the E2B Template API: build requests, the file-context store
//! the SDK uploads to, build status and logs, names, tags and deletion. The execution of a build
//! is in `template_builder`; what a build is made of in `template_spec`.
//!
//! A custom template is saved as `<template dir>/<id>.json` (its builds, and which build each
//! tag names) next to its store row; its trees are build layers in the image cache, so both
//! survive a restart (`load_custom_templates`).
//!
//! Every verb takes the [`Caller`]: a custom template is its team's (names unique per team,
//! built-in names reserved), and another team's template, build or upload is "not found".
//! Uploaded archives are kept per team (`files/<team>/<hash>.tar`), so a team can only ever
//! fill its own cache.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::template::spec::valid_files_hash;
pub use crate::template::types::{
    BuildCreated, BuildFailure, BuildLogEntry, BuildReport, BuildRequest, BuildStart, BuildStatus,
    MAX_UPLOAD_BYTES, TemplateBuildError, TemplateBuilds,
};
use crate::template::types::{
    BuildRecord, BuildState, BuiltTemplate, CustomTemplate, DEFAULT_TAG, UPLOAD_LINK_TTL,
    UploadGrant, io_err,
};
use crate::types::{Caller, TemplateInfo};
/// Registry credentials a build request carries (redacted `Debug`).
pub use bulkhead_images::oci::RegistryCredentials;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl From<TemplateBuildError> for EngineError {
    fn from(e: TemplateBuildError) -> Self {
        EngineError::TemplateBuild(e)
    }
}

/// E2B names: lowercase letters, digits, `-`, `_`, `.`, optionally `namespace/`.
pub fn validate_name(name: &str) -> Result<(), TemplateBuildError> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
            })
    };
    let valid = match name.split_once('/') {
        Some((ns, n)) => ok(ns) && ok(n),
        None => ok(name),
    };
    if valid {
        Ok(())
    } else {
        Err(TemplateBuildError::Invalid(format!(
            "invalid template name {name:?}: use lowercase letters, digits, '-', '_' and '.' \
             (starting with a letter or digit, at most 128 characters)"
        )))
    }
}

/// E2B tags: letters, digits, `-`, `_`, `.`, at most 128 characters.
pub fn validate_tag(tag: &str) -> Result<(), TemplateBuildError> {
    let valid = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(TemplateBuildError::Invalid(format!(
            "invalid tag {tag:?}: use letters, digits, '-', '_' and '.' (starting with a letter \
             or digit, at most 128 characters)"
        )))
    }
}

/// `name:tag` → (name, tag or `default`).
pub fn split_name(full: &str) -> (&str, &str) {
    match full.rsplit_once(':') {
        Some((n, t)) => (n, t),
        None => (full, DEFAULT_TAG),
    }
}

impl Engine {
    fn template_dir(&self) -> Result<&Path, TemplateBuildError> {
        self.cfg
            .template_dir
            .as_deref()
            .ok_or(TemplateBuildError::NotConfigured)
    }

    /// Where team `team_id`'s uploaded archive of `files_hash` is kept (each team its own
    /// directory: an upload never serves another team's build).
    pub(crate) fn upload_path(
        &self,
        team_id: &str,
        files_hash: &str,
    ) -> Result<PathBuf, TemplateBuildError> {
        if !valid_files_hash(files_hash) {
            return Err(TemplateBuildError::Invalid(format!(
                "{files_hash:?} is not a files hash (64 hex digits)"
            )));
        }
        // Team ids are generated (`default`, `team_<hex>`); anything else must not become a
        // path.
        if team_id.is_empty()
            || !team_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(TemplateBuildError::Invalid(format!(
                "team id {team_id:?} cannot name an upload directory"
            )));
        }
        Ok(self
            .template_dir()?
            .join("files")
            .join(team_id)
            .join(format!("{}.tar", files_hash.to_ascii_lowercase())))
    }

    /// `POST /v3/templates`: a new build of the named template (created when new). The
    /// template is the caller's team's; a name of a built-in template or of one of the
    /// team's snapshots is refused (one name never means two things to a create).
    pub async fn request_template_build(
        &self,
        caller: &Caller,
        req: BuildRequest,
    ) -> Result<BuildCreated> {
        self.template_dir()?;
        let (name, tag) = split_name(&req.name);
        validate_name(name)?;
        validate_tag(tag)?;
        let mut tags = vec![tag.to_owned()];
        for t in &req.tags {
            validate_tag(t)?;
            if !tags.contains(t) {
                tags.push(t.clone());
            }
        }
        if self.public_template(name).is_some() {
            return Err(TemplateBuildError::Invalid(format!(
                "{name:?} is a built-in template of this server; choose another name"
            ))
            .into());
        }
        self.check_not_snapshot(caller, name).await?;
        // The team's template of that name, or the one a first build still in flight made
        // (two first builds must not make two templates of one name).
        let template_id = self
            .team_template_id(&caller.team_id, name)
            .or_else(|| crate::template::names::team_build_id(self, caller, name))
            .unwrap_or_else(ids::template_id);
        let cpu_count = req.cpu_count.unwrap_or(2).clamp(1, 64);
        let memory_mb = req.memory_mb.unwrap_or(1024).clamp(128, 65536);
        // Refused here, before anything runs: a build sandbox is as big as the team's own
        // sandboxes may be.
        self.check_build_quotas(&caller.team_id, cpu_count, memory_mb)
            .await?;
        let build_id = ids::uuid();
        let record = Arc::new(BuildRecord {
            team_id: caller.team_id.clone(),
            template_id: template_id.clone(),
            build_id: build_id.clone(),
            name: name.to_owned(),
            tags: tags.clone(),
            cpu_count,
            memory_mb,
            state: Mutex::new(BuildState {
                status: BuildStatus::Waiting,
                logs: Default::default(),
                dropped: 0,
                failure: None,
            }),
        });
        self.builds
            .builds
            .lock()
            .expect("builds")
            .insert(build_id.clone(), record);
        Ok(BuildCreated {
            template_id,
            build_id,
            name: name.to_owned(),
            tags,
        })
    }

    /// Refuses a template name that is one of the caller's team's snapshots (409).
    async fn check_not_snapshot(&self, caller: &Caller, name: &str) -> Result<()> {
        let snapshot = crate::template::names::team_snapshot(self, caller, name)
            .await?
            .filter(|s| s.name.as_deref() == Some(name));
        if snapshot.is_some() {
            return Err(EngineError::Conflict(format!(
                "A snapshot named '{name}' (a template and a snapshot of a team cannot share a \
                 name, or creates from it would be ambiguous: choose another template name, or \
                 delete the snapshot with DELETE /templates/{name})"
            )));
        }
        Ok(())
    }

    fn build_record(
        &self,
        caller: &Caller,
        template_id: &str,
        build_id: &str,
    ) -> Result<Arc<BuildRecord>> {
        let b = self
            .builds
            .builds
            .lock()
            .expect("builds")
            .get(build_id)
            .cloned();
        match b {
            // Another team's build is as unknown as a missing one.
            Some(b) if b.template_id == template_id && b.team_id == caller.team_id => Ok(b),
            _ => Err(TemplateBuildError::NotFound(format!(
                "build {build_id} of template {template_id} not found"
            ))
            .into()),
        }
    }

    /// `GET /templates/{id}/files/{hash}`: has the caller's team already uploaded this
    /// archive? (Another team's uploads are never looked at: no oracle across teams.)
    pub fn template_file_present(
        &self,
        caller: &Caller,
        template_id: &str,
        files_hash: &str,
    ) -> Result<bool> {
        let known = self
            .builds
            .custom
            .lock()
            .expect("custom")
            .get(template_id)
            .is_some_and(|c| c.team_id == caller.team_id)
            || self
                .builds
                .builds
                .lock()
                .expect("builds")
                .values()
                .any(|b| b.template_id == template_id && b.team_id == caller.team_id);
        if !known {
            return Err(
                TemplateBuildError::NotFound(format!("template {template_id} not found")).into(),
            );
        }
        Ok(self.upload_path(&caller.team_id, files_hash)?.is_file())
    }

    /// A token that lets the bearer upload the archive of `files_hash` once, within an hour,
    /// into the caller's team's files (the SDK uploads without its API key).
    pub fn issue_upload_token(&self, caller: &Caller, files_hash: &str) -> String {
        let token = ids::random_hex(24);
        let now = std::time::Instant::now();
        let mut up = self.builds.uploads.lock().expect("uploads");
        up.retain(|_, g| g.expires > now);
        up.insert(
            token.clone(),
            UploadGrant {
                team_id: caller.team_id.clone(),
                files_hash: files_hash.to_ascii_lowercase(),
                expires: now + UPLOAD_LINK_TTL,
            },
        );
        token
    }

    /// Takes an upload token for `files_hash` (constant-time comparison of the hash it was
    /// issued for): the team whose files the upload goes to, or None.
    pub fn take_upload_token(&self, files_hash: &str, token: &str) -> Option<String> {
        let mut up = self.builds.uploads.lock().expect("uploads");
        match up.remove(token) {
            Some(g)
                if g.expires > std::time::Instant::now()
                    && bulkhead_common::constant_time_eq(
                        &g.files_hash,
                        &files_hash.to_ascii_lowercase(),
                    ) =>
            {
                Some(g.team_id)
            }
            _ => None,
        }
    }

    /// Stores an uploaded build-context archive in team `team_id`'s files (written to a
    /// temporary file, renamed into place when complete, so a broken upload never looks
    /// present).
    pub async fn store_template_file(
        &self,
        team_id: &str,
        files_hash: &str,
        mut body: impl futures::Stream<Item = std::result::Result<bytes::Bytes, io::Error>> + Unpin,
    ) -> Result<u64> {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let dest = self.upload_path(team_id, files_hash)?;
        let dir = dest.parent().expect("files dir").to_owned();
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(io_err("create the directory for build files", Some(&dir)))?;
        let tmp = dir.join(format!(".{}.{}", ids::random_hex(8), files_hash));
        let mut f = tokio::fs::File::create(&tmp)
            .await
            .map_err(io_err("store the upload", Some(&tmp)))?;
        let mut total = 0u64;
        let written: Result<(), TemplateBuildError> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(io_err("read the upload", None))?;
                total += chunk.len() as u64;
                if total > MAX_UPLOAD_BYTES {
                    return Err(TemplateBuildError::TooLarge {
                        limit: MAX_UPLOAD_BYTES,
                    });
                }
                f.write_all(&chunk)
                    .await
                    .map_err(io_err("write the build files", Some(&tmp)))?;
            }
            f.sync_all()
                .await
                .map_err(io_err("sync the upload", Some(&tmp)))?;
            let check = tmp.clone();
            tokio::task::spawn_blocking(move || check_archive(&check))
                .await
                .map_err(|e| io_err("check the upload", None)(io::Error::other(e)))?
                .map_err(|why| {
                    TemplateBuildError::Invalid(format!(
                        "the upload is not a tar archive (plain or gzip): {why}; upload the \
                         archive the SDK makes for the step"
                    ))
                })?;
            tokio::fs::rename(&tmp, &dest)
                .await
                .map_err(io_err("move the build files into place", Some(&tmp)))
        }
        .await;
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e.into());
        }
        Ok(total)
    }

    /// `POST /v2/templates/{id}/builds/{build}`: starts the build in the background.
    pub async fn start_template_build(
        self: &Arc<Self>,
        caller: &Caller,
        template_id: &str,
        build_id: &str,
        spec: BuildStart,
    ) -> Result<()> {
        let record = self.build_record(caller, template_id, build_id)?;
        if spec.from_image.is_some() == spec.from_template.is_some() {
            return Err(TemplateBuildError::Invalid(
                "give exactly one of fromImage and fromTemplate".into(),
            )
            .into());
        }
        for (i, s) in spec.steps.iter().enumerate() {
            s.validate(i)
                .map_err(|e| TemplateBuildError::Invalid(e.to_string()))?;
        }
        // The team's quotas (read again: they may have changed since the request) and its
        // concurrent builds; 429 when the team already runs its limit.
        self.admit_build(&record).await?;
        let engine = self.clone();
        tokio::spawn(async move { engine.run_template_build(record, spec).await });
        Ok(())
    }

    /// `GET /templates/{id}/builds/{build}/status`.
    pub fn template_build_status(
        &self,
        caller: &Caller,
        template_id: &str,
        build_id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<BuildReport> {
        let record = self.build_record(caller, template_id, build_id)?;
        let s = record.state.lock().expect("build state");
        let from = offset.saturating_sub(s.dropped).min(s.logs.len());
        let to = (from + limit).min(s.logs.len());
        let tail = s.logs.len().saturating_sub(20);
        Ok(BuildReport {
            template_id: record.template_id.clone(),
            build_id: record.build_id.clone(),
            status: s.status,
            entries: s.logs.range(from..to).cloned().collect(),
            failure: s.failure.clone(),
            failure_entries: if s.failure.is_some() {
                s.logs.range(tail..).cloned().collect()
            } else {
                Vec::new()
            },
        })
    }

    /// Saves a finished build and makes its tags start it.
    pub(crate) async fn record_custom_build(
        &self,
        record: &BuildRecord,
        built: BuiltTemplate,
    ) -> Result<()> {
        let _guard = self.builds.change.lock().await;
        let mut t = self
            .builds
            .custom
            .lock()
            .expect("custom")
            .get(&record.template_id)
            .cloned()
            .unwrap_or_else(|| CustomTemplate {
                id: record.template_id.clone(),
                team_id: record.team_id.clone(),
                name: record.name.clone(),
                cpu_count: record.cpu_count,
                memory_mb: record.memory_mb,
                created_at_ms: now_ms(),
                builds: BTreeMap::new(),
                tags: BTreeMap::new(),
            });
        t.cpu_count = record.cpu_count;
        t.memory_mb = record.memory_mb;
        t.builds.insert(record.build_id.clone(), built);
        for tag in &record.tags {
            t.tags
                .insert(tag.clone(), (record.build_id.clone(), now_ms()));
        }
        self.save_custom(&t).await?;
        self.register_custom(&t).await
    }

    async fn save_custom(&self, t: &CustomTemplate) -> Result<()> {
        let dir = self.template_dir()?.to_owned();
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(io_err("create the directory for build files", Some(&dir)))?;
        let json = serde_json::to_vec_pretty(t).expect("custom template serialises");
        let (path, tmp) = (
            dir.join(format!("{}.json", t.id)),
            dir.join(format!(".{}.json.tmp", t.id)),
        );
        tokio::fs::write(&tmp, json)
            .await
            .map_err(io_err("write the build files", Some(&tmp)))?;
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(io_err("move the build files into place", Some(&tmp)))?;
        self.builds
            .custom
            .lock()
            .expect("custom")
            .insert(t.id.clone(), t.clone());
        Ok(())
    }

    fn info_for(&self, t: &CustomTemplate, build_id: &str) -> Option<TemplateInfo> {
        let b = t.builds.get(build_id)?;
        Some(TemplateInfo {
            id: t.id.clone(),
            aliases: vec![t.name.clone()],
            rootfs: b.rootfs.clone(),
            content_hash: b.content_hash.clone(),
            cpu_count: t.cpu_count,
            memory_mb: t.memory_mb,
            disk_size_mb: self.cfg.sandbox_disk_mb,
            pids_max: 1024,
            runtime: Some(Arc::new(b.runtime.clone())),
        })
    }

    /// Makes a custom template's tags startable: the default tag under its id, the others as
    /// `id:tag` (its name and `name:tag` resolve to these within its team: `template_for`).
    async fn register_custom(&self, t: &CustomTemplate) -> Result<()> {
        self.unregister_custom(&t.id);
        let main = t.main_build().map(|(b, _)| b.clone());
        if let Some(info) = main.as_deref().and_then(|b| self.info_for(t, b)) {
            self.register_in(info, Some(&t.team_id)).await?;
            // Members started from the previous build's tree must not be handed out.
            self.drain_pool(&t.id).await;
        }
        for (tag, (build_id, _)) in &t.tags {
            let Some(info) = self.info_for(t, build_id) else {
                continue;
            };
            if tag == DEFAULT_TAG {
                continue;
            }
            {
                let info = Arc::new(info);
                let mut map = self.templates.write().expect("templates lock");
                map.insert(format!("{}:{tag}", t.id), info);
            }
        }
        Ok(())
    }

    fn unregister_custom(&self, id: &str) {
        let prefix = format!("{id}:");
        let mut map = self.templates.write().expect("templates lock");
        map.retain(|k, v| v.id != id && !k.starts_with(&prefix));
    }

    /// Re-registers the custom templates saved by earlier runs whose trees are still cached.
    pub async fn load_custom_templates(&self) -> Result<usize> {
        let Some(dir) = self.cfg.template_dir.clone() else {
            return Ok(0);
        };
        let mut n = 0;
        let Ok(mut rd) = tokio::fs::read_dir(&dir).await else {
            return Ok(0);
        };
        while let Ok(Some(e)) = rd.next_entry().await {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "json")
                || e.file_name().to_string_lossy().starts_with('.')
            {
                continue;
            }
            let Ok(bytes) = tokio::fs::read(&p).await else {
                continue;
            };
            let mut t: CustomTemplate = match serde_json::from_slice(&bytes) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "unreadable custom template");
                    continue;
                }
            };
            t.builds.retain(|_, b| b.rootfs.is_dir());
            t.tags.retain(|_, (b, _)| t.builds.contains_key(b));
            if t.tags.is_empty() {
                continue;
            }
            self.builds
                .custom
                .lock()
                .expect("custom")
                .insert(t.id.clone(), t.clone());
            self.register_custom(&t).await?;
            n += 1;
        }
        Ok(n)
    }

    /// `f` of team `team_id`'s custom template with this id or name (an id wins); another
    /// team's is None.
    fn find_custom<R>(
        &self,
        team_id: &str,
        id_or_name: &str,
        f: impl FnOnce(&CustomTemplate) -> R,
    ) -> Option<R> {
        let custom = self.builds.custom.lock().expect("custom");
        custom
            .get(id_or_name)
            .filter(|c| c.team_id == team_id)
            .or_else(|| {
                custom
                    .values()
                    .find(|c| c.team_id == team_id && c.name == id_or_name)
            })
            .map(f)
    }

    /// The caller's team's custom template with this id or name.
    fn custom_by_name(&self, caller: &Caller, id_or_name: &str) -> Option<CustomTemplate> {
        self.find_custom(&caller.team_id, id_or_name, CustomTemplate::clone)
    }

    /// The id of team `team_id`'s custom template with this id or name.
    pub(crate) fn team_template_id(&self, team_id: &str, id_or_name: &str) -> Option<String> {
        self.find_custom(team_id, id_or_name, |c| c.id.clone())
    }

    /// Is `id_or_name` a template the caller's team built through the Template API?
    pub fn is_custom_template(&self, caller: &Caller, id_or_name: &str) -> bool {
        self.team_template_id(&caller.team_id, id_or_name).is_some()
    }

    /// `GET /templates/aliases/{alias}`: the template id a name starts for the caller.
    pub fn template_by_alias(&self, caller: &Caller, alias: &str) -> Result<String> {
        if let Some(id) = self.team_template_id(&caller.team_id, alias) {
            return Ok(id);
        }
        self.public_template(alias)
            .map(|t| t.id.clone())
            .ok_or_else(|| EngineError::TemplateNotFound(alias.to_owned()))
    }

    /// `POST /templates/tags`: points `tags` at the build `target` (`name:tag`) names.
    pub async fn assign_template_tags(
        &self,
        caller: &Caller,
        target: &str,
        tags: &[String],
    ) -> Result<(String, Vec<String>)> {
        let (name, from) = split_name(target);
        validate_tag(from)?;
        if tags.is_empty() {
            return Err(TemplateBuildError::Invalid("give at least one tag".into()).into());
        }
        for t in tags {
            validate_tag(t)?;
        }
        let _guard = self.builds.change.lock().await;
        let mut t = self
            .custom_by_name(caller, name)
            .ok_or_else(|| EngineError::TemplateNotFound(name.to_owned()))?;
        let build = t
            .tags
            .get(from)
            .map(|(b, _)| b.clone())
            .ok_or_else(|| TemplateBuildError::NotFound(format!("tag {target:?} not found")))?;
        for tag in tags {
            t.tags.insert(tag.clone(), (build.clone(), now_ms()));
        }
        self.save_custom(&t).await?;
        self.register_custom(&t).await?;
        Ok((build, tags.to_vec()))
    }

    /// `DELETE /templates/tags`.
    pub async fn remove_template_tags(
        &self,
        caller: &Caller,
        name: &str,
        tags: &[String],
    ) -> Result<()> {
        let _guard = self.builds.change.lock().await;
        let mut t = self
            .custom_by_name(caller, name)
            .ok_or_else(|| EngineError::TemplateNotFound(name.to_owned()))?;
        for tag in tags {
            validate_tag(tag)?;
            if t.tags.remove(tag).is_none() {
                return Err(TemplateBuildError::NotFound(format!(
                    "template {name:?} has no tag {tag:?}"
                ))
                .into());
            }
        }
        self.save_custom(&t).await?;
        self.register_custom(&t).await
    }

    /// `GET /templates/{id}/tags`: (tag, build id, assigned at in ms).
    pub fn template_tags(
        &self,
        caller: &Caller,
        id_or_name: &str,
    ) -> Result<Vec<(String, String, i64)>> {
        let t = self
            .custom_by_name(caller, id_or_name)
            .ok_or_else(|| EngineError::TemplateNotFound(id_or_name.to_owned()))?;
        Ok(t.tags
            .iter()
            .map(|(tag, (b, at))| (tag.clone(), b.clone(), *at))
            .collect())
    }

    /// `DELETE /templates/{id}`: the template can no longer be started; running sandboxes keep
    /// their tree, and its layers stay in the cache for other templates that share them.
    pub async fn delete_template(&self, caller: &Caller, id_or_name: &str) -> Result<()> {
        let _guard = self.builds.change.lock().await;
        let Some(t) = self.custom_by_name(caller, id_or_name) else {
            if self.public_template(id_or_name).is_some() {
                return Err(TemplateBuildError::Invalid(format!(
                    "{id_or_name:?} is a built-in template and cannot be deleted"
                ))
                .into());
            }
            return Err(EngineError::TemplateNotFound(id_or_name.to_owned()));
        };
        let path = self.template_dir()?.join(format!("{}.json", t.id));
        match tokio::fs::remove_file(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove the template's files", Some(&path))(e).into()),
        }
        self.builds.custom.lock().expect("custom").remove(&t.id);
        self.unregister_custom(&t.id);
        self.drain_pool(&t.id).await;
        self.store.delete_template(&t.id).await?;
        Ok(())
    }
}

/// Why an upload is not a build-context archive.
#[derive(Debug, thiserror::Error)]
enum ArchiveError {
    #[error("{0}")]
    Read(#[from] io::Error),
    #[error("it holds no files")]
    Empty,
}

/// Is the file at `path` a tar archive, plain or gzip-compressed (what the SDKs upload)?
/// Every entry is read through (and a gzip stream to its checksum), so a truncated, corrupt
/// or foreign upload is refused when it arrives instead of failing the step that unpacks it.
fn check_archive(path: &Path) -> std::result::Result<(), ArchiveError> {
    use std::io::{Read, Seek};
    let mut f = std::fs::File::open(path)?;
    let mut magic = [0u8; 2];
    let gzip = f.read(&mut magic)? == 2 && magic == [0x1f, 0x8b];
    f.rewind()?;
    let f = io::BufReader::new(f);
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(f))
    } else {
        Box::new(f)
    };
    let mut archive = tar::Archive::new(reader);
    let mut entries = 0usize;
    for entry in archive.entries()? {
        let mut entry = entry?;
        io::copy(&mut entry, &mut io::sink())?;
        entries += 1;
    }
    // The rest of the stream (tar padding, the gzip trailer with its CRC).
    io::copy(&mut archive.into_inner(), &mut io::sink())?;
    if entries == 0 {
        return Err(ArchiveError::Empty);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
