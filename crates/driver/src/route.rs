//! [`ByTemplate`]: one [`Driver`] made of several, so that one server can run some templates
//! in the jail and others in microVMs (`bulkhead serve --driver-for TEMPLATE=microvm`).
//!
//! A sandbox is started by the driver of its template (the default one for every template not
//! listed); afterwards each call goes to the driver named in its handle, and a call about a
//! checkpoint directory to the driver that recognises it ([`Driver::checkpoint_info`]). The
//! optional capabilities are those *every* driver has, since the engine asks about them without
//! naming a sandbox (a server mixing a driver that checkpoints with one that does not, does not
//! pause). The conformance suite runs against it (`bulkhead-driver`'s tests, over two fakes).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::capability::{
    Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, FileChange, RestoreOptions,
};
use crate::driver::{AgentStream, Driver, ResourceUsage};
use crate::error::DriverError;
use crate::handle::{DriverHandle, SandboxSpec};

pub struct ByTemplate {
    default: Arc<dyn Driver>,
    templates: HashMap<String, Arc<dyn Driver>>,
    /// Every driver once, the default first.
    all: Vec<Arc<dyn Driver>>,
}

impl ByTemplate {
    /// `templates`: template id → the driver that runs it; the rest run on `default`.
    pub fn new(default: Arc<dyn Driver>, templates: HashMap<String, Arc<dyn Driver>>) -> Self {
        let mut all = vec![default.clone()];
        for d in templates.values() {
            if !all.iter().any(|a| a.name() == d.name()) {
                all.push(d.clone());
            }
        }
        ByTemplate {
            default,
            templates,
            all,
        }
    }

    fn for_template(&self, template_id: &str) -> &Arc<dyn Driver> {
        self.templates.get(template_id).unwrap_or(&self.default)
    }

    /// The driver that made `h`, if it is one of ours.
    fn for_handle(&self, h: &DriverHandle) -> Option<&Arc<dyn Driver>> {
        self.all.iter().find(|d| d.owns(h))
    }

    fn of(&self, h: &DriverHandle) -> Result<&Arc<dyn Driver>, DriverError> {
        self.for_handle(h).ok_or(DriverError::NotRunning)
    }

    /// The driver that wrote the checkpoint in `dir` (the default one when none says so).
    fn for_checkpoint(&self, dir: &Path) -> &Arc<dyn Driver> {
        self.all
            .iter()
            .find(|d| d.checkpoint_info(dir).is_some())
            .unwrap_or(&self.default)
    }
}

#[async_trait]
impl Driver for ByTemplate {
    fn name(&self) -> &'static str {
        self.default.name()
    }

    fn owns(&self, h: &DriverHandle) -> bool {
        self.for_handle(h).is_some()
    }

    fn capabilities(&self) -> Capabilities {
        let caps: Vec<Capabilities> = self.all.iter().map(|d| d.capabilities()).collect();
        Capabilities::common(&caps)
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.for_template(&spec.template_id).start(spec).await
    }

    async fn start_warm(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.for_template(&spec.template_id).start_warm(spec).await
    }

    async fn claimed(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.of(h)?.claimed(h).await
    }

    async fn stop(&self, h: &DriverHandle) -> Result<(), DriverError> {
        match self.for_handle(h) {
            Some(d) => d.stop(h).await,
            None => Ok(()),
        }
    }

    async fn wait(&self, h: &DriverHandle) {
        if let Some(d) = self.for_handle(h) {
            d.wait(h).await
        }
    }

    async fn adopt(&self, h: &DriverHandle) -> bool {
        match self.for_handle(h) {
            Some(d) => d.adopt(h).await,
            None => false,
        }
    }

    async fn connect(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
        self.of(h)?.connect(h).await
    }

    async fn usage(&self, h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        self.of(h)?.usage(h).await
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let mut n = 0;
        for d in &self.all {
            n += d.reclaim_orphans(keep).await?;
        }
        Ok(n)
    }

    async fn open_network(&self, h: &DriverHandle) -> Result<OwnedFd, DriverError> {
        self.of(h)?.open_network(h).await
    }

    async fn freeze(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.of(h)?.freeze(h).await
    }

    async fn thaw(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.of(h)?.thaw(h).await
    }

    async fn checkpoint(
        &self,
        h: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        self.of(h)?.checkpoint(h, dir, opts).await
    }

    fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        self.all.iter().find_map(|d| d.checkpoint_info(dir))
    }

    fn checkpoint_key(&self) -> Option<String> {
        self.default.checkpoint_key()
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        self.for_template(&spec.template_id)
            .restore(spec, dir, opts)
            .await
    }

    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        match of {
            ChangeSource::Running(h) => self.of(h)?.changes(of, since).await,
            ChangeSource::Checkpoint(dir) => self.for_checkpoint(dir).changes(of, since).await,
        }
    }

    async fn export_changes(&self, h: &DriverHandle, dest: &Path) -> Result<(), DriverError> {
        self.of(h)?.export_changes(h, dest).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::NetworkLink;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Counts starts and stops; its handles carry its name.
    struct Counting {
        name: &'static str,
        caps: Capabilities,
        started: AtomicU32,
        stopped: AtomicU32,
    }

    impl Counting {
        fn new(name: &'static str, caps: Capabilities) -> Arc<Counting> {
            Arc::new(Counting {
                name,
                caps,
                started: AtomicU32::new(0),
                stopped: AtomicU32::new(0),
            })
        }
    }

    #[async_trait]
    impl Driver for Counting {
        fn name(&self) -> &'static str {
            self.name
        }
        fn capabilities(&self) -> Capabilities {
            self.caps
        }
        async fn start(&self, _spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
            let n = self.started.fetch_add(1, Ordering::SeqCst);
            Ok(DriverHandle::new(
                self.name,
                100 + n as i32,
                1,
                n,
                serde_json::Value::Null,
            ))
        }
        async fn stop(&self, _h: &DriverHandle) -> Result<(), DriverError> {
            self.stopped.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn wait(&self, _h: &DriverHandle) {}
        async fn adopt(&self, _h: &DriverHandle) -> bool {
            true
        }
        async fn connect(&self, _h: &DriverHandle) -> Result<AgentStream, DriverError> {
            Err(DriverError::NotRunning)
        }
        async fn usage(&self, _h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
            Ok(ResourceUsage::default())
        }
        async fn reclaim_orphans(&self, _keep: &[DriverHandle]) -> Result<usize, DriverError> {
            Ok(1)
        }
    }

    fn spec(template: &str) -> SandboxSpec {
        SandboxSpec {
            disk_mb: 0,
            template_id: template.into(),
            rootfs: "/nonexistent".into(),
            cpu_count: 1,
            memory_mb: 64,
            pids_max: 64,
            volumes: Vec::new(),
        }
    }

    fn caps(freeze: bool, checkpoint: bool, network: NetworkLink) -> Capabilities {
        Capabilities {
            freeze,
            checkpoint,
            snapshot: checkpoint,
            network,
            warm_start: checkpoint,
            changes: checkpoint,
            export_changes: checkpoint,
            checkpoint_key: checkpoint,
        }
    }

    #[tokio::test]
    async fn sandboxes_start_on_their_templates_driver_and_calls_follow_the_handle() {
        let jail = Counting::new("jail", caps(true, true, NetworkLink::TunInNetns));
        let vm = Counting::new("microvm", caps(true, false, NetworkLink::VmNic));
        let d = ByTemplate::new(
            jail.clone(),
            HashMap::from([("vmt".to_string(), vm.clone() as Arc<dyn Driver>)]),
        );
        let h = d.start(&spec("vmt")).await.unwrap();
        assert_eq!(h.driver, "microvm");
        let h2 = d.start(&spec("base")).await.unwrap();
        assert_eq!(h2.driver, "jail");
        assert!(d.owns(&h) && d.owns(&h2));
        d.stop(&h).await.unwrap();
        assert_eq!(vm.stopped.load(Ordering::SeqCst), 1);
        assert_eq!(jail.stopped.load(Ordering::SeqCst), 0);
        // Every driver reclaims its own orphans.
        assert_eq!(d.reclaim_orphans(&[]).await.unwrap(), 2);
        // A handle of no driver here: not ours, not running.
        let mut foreign = h.clone();
        foreign.driver = "other".into();
        assert!(!d.owns(&foreign));
        assert!(!d.adopt(&foreign).await);
        assert!(matches!(
            d.usage(&foreign).await,
            Err(DriverError::NotRunning)
        ));
        // Only what both can do.
        assert_eq!(d.capabilities(), caps(true, false, NetworkLink::TunInNetns));
    }
}
