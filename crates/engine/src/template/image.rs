//! The starting point of a template build: a template this server has (`from_template`, or
//! `e2bdev/base` / `e2bdev/code-interpreter` by image name) or an image pulled from an OCI
//! registry (`from_image`, the Dockerfile's `FROM`). A pulled image is a foreign tree: it is
//! cached by manifest digest (the build's cache keys chain from that hash, so a re-pushed tag
//! rebuilds), checked for what the in-sandbox agent needs before any sandbox starts, and
//! given E2B's `user` account when it has none. Its env vars carry into the steps and the
//! template's sandboxes; user and workdir start at E2B's defaults (`user` in `/home/user`),
//! as on E2B, whatever the image's `USER`/`WORKDIR` say.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use bulkhead_images::oci::{RegistryCredentials, sandbox_blockers};
use bulkhead_images::{ImageCache, Progress};

use crate::engine::Engine;
use crate::template::spec::{BuildStep, RunState, StepKind};
use crate::template::types::StepError;
use crate::template::types::{BuildRecord, BuildStart};

/// Where a build starts.
pub(crate) struct Parent {
    pub(crate) rootfs: PathBuf,
    /// The content hash the step keys chain from (a pulled image's: from its manifest digest).
    pub(crate) content_hash: String,
    pub(crate) state: RunState,
    /// For the build log: `template base`, `image docker.io/library/debian:bookworm@sha256:…`.
    pub(crate) label: String,
    /// A step run as root before the user's steps (a pulled image without E2B's `user`).
    pub(crate) provision: Option<BuildStep>,
    pub(crate) pulled: bool,
}

/// Images that map to a template this server has without a registry.
fn image_template(image: &str) -> Option<&'static str> {
    match image.trim_start_matches("docker.io/") {
        "e2bdev/base" | "e2bdev/base:latest" => Some("base"),
        "e2bdev/code-interpreter" | "e2bdev/code-interpreter:latest" => Some("code-interpreter-v1"),
        _ => None,
    }
}

/// Adds E2B's `user` (with a home, bash as shell) to an image that has account files but no
/// such user (e.g. uid 1000 is taken, as `node` is in the Node images): with the image's own
/// tools, since the uid must be picked among the image's accounts.
const PROVISION_USER: &str = r#"set -e
if ! id -u user >/dev/null 2>&1; then
  if command -v useradd >/dev/null 2>&1; then useradd -m -s /bin/bash user
  elif command -v adduser >/dev/null 2>&1; then adduser -D -s /bin/bash user
  else echo "the image has no user 'user' and no useradd/adduser to create it: add the account in the image" >&2; exit 1
  fi
fi"#;

/// Pull progress as build log lines (step `base`).
struct BuildProgress<'a>(&'a BuildRecord);

impl Progress for BuildProgress<'_> {
    fn stage(&self, msg: &str) {
        self.0.log("info", Some("base"), format!("[base] {msg}"));
    }
    fn line(&self, line: &str) {
        self.0.log("debug", Some("base"), line.to_owned());
    }
    fn done(&self) {}
}

impl Engine {
    pub(crate) async fn build_parent(
        &self,
        record: &BuildRecord,
        spec: &BuildStart,
    ) -> Result<Parent, StepError> {
        let name = match (&spec.from_template, &spec.from_image) {
            (Some(t), _) => t.clone(),
            (None, Some(image)) => match image_template(image) {
                Some(t) => t.to_owned(),
                None => {
                    return self
                        .pull_parent(record, image, spec.registry_credentials.as_ref())
                        .await;
                }
            },
            (None, None) => return Err(StepError::NoBase),
        };
        // The build's team's templates and the built-ins, never another team's.
        let parent = self
            .template_in_team(&record.team_id, &name)
            .ok_or_else(|| StepError::NoSuchTemplate(name.clone()))?;
        let state = match &parent.runtime {
            Some(rt) => RunState {
                user: rt.user.clone(),
                workdir: rt.workdir.clone(),
                envs: rt.envs.clone(),
            },
            None => RunState::default(),
        };
        Ok(Parent {
            rootfs: parent.rootfs.clone(),
            content_hash: parent.content_hash.clone(),
            state,
            label: format!("template {}", parent.aliases.first().unwrap_or(&parent.id)),
            provision: None,
            pulled: false,
        })
    }

    async fn pull_parent(
        &self,
        record: &BuildRecord,
        image: &str,
        credentials: Option<&RegistryCredentials>,
    ) -> Result<Parent, StepError> {
        let started = Instant::now();
        let cache = ImageCache::new(&self.cfg.image_cache);
        let pulled = cache
            .pull_image(
                image,
                &self.cfg.registry,
                credentials,
                &BuildProgress(record),
            )
            .await
            .map_err(StepError::Pull)?;
        record.log(
            "info",
            Some("base"),
            format!(
                "[base] image {}@{} {} in {:.1}s",
                pulled.reference,
                pulled.manifest_digest,
                if pulled.cached {
                    "from the cache"
                } else {
                    "pulled"
                },
                started.elapsed().as_secs_f64()
            ),
        );
        let root = pulled.rootfs.clone();
        let blockers = tokio::task::spawn_blocking(move || sandbox_blockers(&root))
            .await
            .map_err(StepError::CheckImage)?;
        if !blockers.is_empty() {
            return Err(StepError::NotRunnable {
                image: pulled.reference.to_string(),
                missing: blockers.join(" and no "),
            });
        }
        let c = &pulled.config;
        if c.user.is_some() || c.workdir.is_some() {
            // E2B starts every template at `user` in `/home/user`; the image's own USER and
            // WORKDIR are for `docker run`. Said in the log so nobody is surprised.
            record.log(
                "info",
                Some("base"),
                format!(
                    "[base] the image's USER {:?} / WORKDIR {:?} are not applied: steps and \
                     sandboxes start as `user` in /home/user (E2B's defaults; use \
                     set_user/set_workdir to change them)",
                    c.user.as_deref().unwrap_or("root"),
                    c.workdir.as_deref().unwrap_or("/"),
                ),
            );
        }
        let envs: BTreeMap<String, String> = c.env.iter().cloned().collect();
        let provision = pulled.sandbox_user.is_none().then(|| BuildStep {
            kind: StepKind::Run,
            args: vec![PROVISION_USER.to_owned(), "root".to_owned()],
            files_hash: None,
            force: false,
        });
        Ok(Parent {
            rootfs: pulled.rootfs,
            content_hash: pulled.hash,
            state: RunState {
                envs,
                ..RunState::default()
            },
            label: format!("image {}@{}", pulled.reference, pulled.manifest_digest),
            provision,
            pulled: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_base_images_map_to_local_templates_and_others_pull() {
        assert_eq!(image_template("e2bdev/base"), Some("base"));
        assert_eq!(image_template("docker.io/e2bdev/base:latest"), Some("base"));
        assert_eq!(
            image_template("e2bdev/code-interpreter"),
            Some("code-interpreter-v1")
        );
        assert_eq!(image_template("debian:bookworm"), None);
        assert_eq!(image_template("e2bdev/base:other-tag"), None);
    }
}
