//! Templates the engine can start sandboxes from: registration (recorded in the store) and lookup by id or alias.
//!
//! Built-in templates (the server's own and `--templates`) are public: every team starts
//! them by id or alias. A template built through the Template API is its team's: the map
//! holds it under its (global, random) id and `id:tag` only, never under its name, and
//! [`Engine::template_for`] resolves a caller's names and ids within the caller's team.

use std::sync::Arc;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::types::{Caller, TemplateInfo};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Make a built-in template available to every team (under its id and aliases); records
    /// it in the store.
    pub async fn register_template(&self, t: TemplateInfo) -> Result<()> {
        self.register_in(t, None).await
    }

    /// Registers `t` as public (`team` None) or as a team's template, which is entered under
    /// its id only: its name means something only within its team (`template_for`).
    pub(crate) async fn register_in(&self, t: TemplateInfo, team: Option<&str>) -> Result<()> {
        let now = now_ms();
        let created_at = match self.store.get_template(&t.id).await? {
            Some(row) => row.created_at,
            None => now,
        };
        self.store
            .upsert_template(&bulkhead_store::TemplateRow {
                id: t.id.clone(),
                alias: t.aliases.first().cloned(),
                content_hash: t.content_hash.clone(),
                status: "ready".into(),
                rootfs_path: t.rootfs.display().to_string(),
                cpu_count: t.cpu_count as i64,
                memory_mb: t.memory_mb as i64,
                disk_size_mb: t.disk_size_mb as i64,
                created_at,
                updated_at: now,
                team_id: team.map(str::to_owned),
            })
            .await?;
        let t = Arc::new(t);
        let mut map = self.templates.write().expect("templates lock");
        map.insert(t.id.clone(), t.clone());
        if team.is_none() {
            for a in &t.aliases {
                map.insert(a.clone(), t.clone());
            }
        }
        drop(map);
        self.pools.wakeup.notify_one();
        Ok(())
    }

    /// What `name` (a name, `name:tag`, an id or `id:tag`) starts for `caller`: the caller's
    /// team's template of that name or id, else a built-in one. Another team's templates are
    /// unknown here, as missing ones are. (Snapshots come after both: `create`.)
    pub fn template_for(&self, caller: &Caller, name: &str) -> Option<Arc<TemplateInfo>> {
        self.template_in_team(&caller.team_id, name)
    }

    /// [`Engine::template_for`] for team `team_id` (a build's parent is looked up in the
    /// build's team).
    pub(crate) fn template_in_team(&self, team_id: &str, name: &str) -> Option<Arc<TemplateInfo>> {
        let (base, tag) = crate::template::builds::split_name(name);
        if let Some(id) = self.team_template_id(team_id, base) {
            return template(
                self,
                &if tag == crate::template::types::DEFAULT_TAG {
                    id
                } else {
                    format!("{id}:{tag}")
                },
            );
        }
        self.public_template(name)
    }

    /// A built-in template by id or alias (None for a key that names a team's template).
    pub fn public_template(&self, key: &str) -> Option<Arc<TemplateInfo>> {
        template(self, key).filter(|t| {
            !self
                .builds
                .custom
                .lock()
                .expect("custom")
                .contains_key(&t.id)
        })
    }

    /// The templates `caller` may start (built-ins and its team's), one per id.
    pub fn templates_for(&self, caller: &Caller) -> Vec<Arc<TemplateInfo>> {
        let custom = self.builds.custom.lock().expect("custom");
        self.templates()
            .into_iter()
            .filter(|t| {
                custom
                    .get(&t.id)
                    .is_none_or(|c| c.team_id == caller.team_id)
            })
            .collect()
    }

    /// Stops the warm pool members of template `id` (its tree changed).
    pub(crate) async fn drain_pool(&self, id: &str) {
        for h in self.node.pool_drain(Some(id)).await {
            let _ = self.node.stop(&h).await;
        }
    }

    pub fn templates(&self) -> Vec<Arc<TemplateInfo>> {
        let map = self.templates.read().expect("templates lock");
        // The entry under its own id (a built template's tags are other entries of that id).
        let mut v: Vec<_> = map
            .iter()
            .filter(|(k, t)| **k == t.id)
            .map(|(_, t)| t.clone())
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }
}

/// The template under this key, whoever's it is: an id, `id:tag`, or a built-in's alias.
/// For a template the engine already holds the id of (a sandbox's, a snapshot's);
/// a caller's name goes through [`Engine::template_for`].
pub(crate) fn template(engine: &Engine, id_or_alias: &str) -> Option<Arc<TemplateInfo>> {
    // `name:default` is the bare name; other tags are entries of their own (see
    // `template_builds`).
    let name = id_or_alias.strip_suffix(":default").unwrap_or(id_or_alias);
    engine
        .templates
        .read()
        .expect("templates lock")
        .get(name)
        .cloned()
}

/// Is `t` what its id starts (so its warm pool holds sandboxes of this tree)? A tag of a
/// built template naming an older build is not.
pub(crate) fn is_pooled_tree(engine: &Engine, t: &TemplateInfo) -> bool {
    engine
        .templates
        .read()
        .expect("templates lock")
        .get(&t.id)
        .is_some_and(|c| c.content_hash == t.content_hash && c.rootfs == t.rootfs)
}
