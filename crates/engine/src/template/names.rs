//! What a name means within a team besides its templates: a template build in flight, or a
//! snapshot (a snapshot is a template to E2B). Snapshots and builds both ask, so that a team
//! never gives one name to two things.

use bulkhead_store::SnapshotRow;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::template::types::BuildStatus;
use crate::types::Caller;

/// `team/name:tag` → `name` (the part this server keys snapshots by).
pub(crate) fn bare_name(reference: &str) -> &str {
    let name = reference.rsplit('/').next().unwrap_or(reference);
    name.split(':').next().unwrap_or(name)
}

/// The caller's team's snapshot `reference` (id or name, with or without its tag); another
/// team's is as unknown as a missing one.
pub(crate) async fn team_snapshot(
    engine: &Engine,
    caller: &Caller,
    reference: &str,
) -> Result<Option<SnapshotRow>, EngineError> {
    Ok(engine
        .store
        .get_snapshot(bare_name(reference))
        .await?
        .filter(|r| r.team_id == caller.team_id))
}

/// The template id of a build of the caller's team's template `name` that is requested
/// or running (its name is taken even before the first build finishes).
pub(crate) fn team_build_id(engine: &Engine, caller: &Caller, name: &str) -> Option<String> {
    engine
        .builds
        .builds
        .lock()
        .expect("builds")
        .values()
        .find(|b| {
            b.team_id == caller.team_id
                && b.name == name
                && matches!(
                    b.state.lock().expect("build state").status,
                    BuildStatus::Waiting | BuildStatus::Building
                )
        })
        .map(|b| b.template_id.clone())
}
