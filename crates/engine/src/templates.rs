//! Templates the engine can start sandboxes from: registration (recorded in the store) and lookup by id or alias.

use std::sync::Arc;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::types::TemplateInfo;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Make a built template available; records it in the store.
    pub async fn register_template(&self, t: TemplateInfo) -> Result<()> {
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
            })
            .await?;
        let t = Arc::new(t);
        let mut map = self.templates.write().expect("templates lock");
        map.insert(t.id.clone(), t.clone());
        for a in &t.aliases {
            map.insert(a.clone(), t.clone());
        }
        drop(map);
        self.pool_wakeup.notify_one();
        Ok(())
    }

    pub fn template(&self, id_or_alias: &str) -> Option<Arc<TemplateInfo>> {
        // `name:default` is the bare name; other tags are entries of their own (see
        // `template_builds`).
        let name = id_or_alias.strip_suffix(":default").unwrap_or(id_or_alias);
        self.templates
            .read()
            .expect("templates lock")
            .get(name)
            .cloned()
    }

    /// Is `t` what its id starts (so its warm pool holds sandboxes of this tree)? A tag of a
    /// built template naming an older build is not.
    pub(crate) fn is_pooled_tree(&self, t: &TemplateInfo) -> bool {
        self.templates
            .read()
            .expect("templates lock")
            .get(&t.id)
            .is_some_and(|c| c.content_hash == t.content_hash && c.rootfs == t.rootfs)
    }

    /// Stops the warm pool members of template `id` (its tree changed).
    pub(crate) async fn drain_pool(&self, id: &str) {
        let members = self
            .pools
            .lock()
            .expect("pool lock")
            .remove(id)
            .unwrap_or_default();
        for h in members {
            let _ = self.driver.stop(&h).await;
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
