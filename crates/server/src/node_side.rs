//! Where sandboxes run on this machine: the drivers the configuration uses and the egress
//! network, wired as one [`LocalNode`]. `bulkhead serve` puts its engine on it in process (the
//! control plane reaches it only through the `Node` trait); a cluster node serves the same
//! `LocalNode` to API replicas.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bulkhead_driver::Driver;
use bulkhead_engine::LocalNode;
use bulkhead_jail::{JailConfig, JailDriver};
use bulkhead_store::Store;

use crate::config::{ConfigError, DriverKind, ServerConfig};
use crate::error::StartError;
use crate::network;

/// The node half of a server.
pub(crate) struct NodeSide {
    pub(crate) node: Arc<LocalNode>,
    /// The jail driver, when it runs sandboxes (its views and cgroups are tidied).
    pub(crate) jail: Option<Arc<JailDriver>>,
}

/// Builds the egress network, the drivers `config` uses (routed per template when
/// `--driver-for` says so) and the node over them, with the egress proxy installed.
pub(crate) fn build(config: &ServerConfig, store: &Store) -> Result<NodeSide, StartError> {
    let exe = std::env::current_exe().map_err(StartError::Executable)?;
    let agent = exe.with_file_name("bulkhead-agent");
    if !agent.exists() {
        return Err(StartError::AgentMissing(agent));
    }
    let net = network::setup(&config.network, &config.data_dir, store)?;
    let jail = match config.uses(DriverKind::Jail) {
        false => None,
        true => Some(Arc::new(
            JailDriver::new(JailConfig {
                state_dir: config.data_dir.join("jail"),
                agent_binary: agent.clone(),
                launcher: vec![exe.into_os_string(), "__jail-launch".into()],
                agent_args: vec![
                    "--max-background-processes".into(),
                    config.max_background_processes.to_string(),
                ],
                uid_base: config.uid_base,
                max_slots: config.slots(),
                cgroup_parent: cgroup_parent(&config.data_dir),
                start_timeout: Duration::from_secs(10),
                sandbox_ca_pem: Some(net.sandbox_ca_pem.clone()),
                nameserver: Some(bulkhead_egress::GATEWAY_ADDR),
                criu: usable_criu(config.criu.as_deref()),
            })
            .map_err(StartError::Driver)?,
        )),
    };
    let vm = match config.uses(DriverKind::Microvm) {
        false => None,
        true => Some(Arc::new(microvm_driver(
            config,
            agent,
            jail.is_some(),
            &net.sandbox_ca_pem,
        )?)),
    };
    let pick = |kind: DriverKind| -> Arc<dyn Driver> {
        match kind {
            DriverKind::Jail => jail.clone().expect("built when used"),
            DriverKind::Microvm => vm.clone().expect("built when used"),
        }
    };
    let driver = if config.driver_for.is_empty() {
        pick(config.driver)
    } else {
        let routes = config
            .driver_for
            .iter()
            .map(|(template, kind)| (template.clone(), pick(*kind)))
            .collect();
        Arc::new(bulkhead_driver::ByTemplate::new(
            pick(config.driver),
            routes,
        ))
    };
    let node = LocalNode::new(driver);
    node.set_egress(net.egress.clone(), Some(net.audit.clone()));
    Ok(NodeSide { node, jail })
}

/// The microvm driver, logging which acceleration it uses and why. Beside the jail its QEMU
/// uids start above the jail's uid ranges, so no VM shares a uid with a jailed sandbox.
fn microvm_driver(
    config: &ServerConfig,
    agent: std::path::PathBuf,
    beside_jail: bool,
    sandbox_ca_pem: &str,
) -> Result<bulkhead_microvm::MicrovmDriver, StartError> {
    let kernel = config
        .guest_kernel
        .clone()
        .ok_or(ConfigError::NoGuestKernel)?;
    // VM images sit next to the template cache, not in it (it lists its own).
    let images = config.image_cache_dir();
    let cache = images.parent().unwrap_or(&images).to_path_buf();
    let mut cfg =
        bulkhead_microvm::MicrovmConfig::new(config.data_dir.join("microvm"), cache, kernel, agent);
    cfg.max_slots = config.slots();
    cfg.sandbox_ca_pem = Some(sandbox_ca_pem.to_owned());
    if beside_jail {
        cfg.uid_base = config
            .uid_base
            .saturating_add(config.slots().saturating_mul(65536));
    }
    let vm = bulkhead_microvm::MicrovmDriver::new(cfg).map_err(StartError::Microvm)?;
    let accel = vm.accel();
    if accel.accel == bulkhead_microvm::Accel::Tcg {
        tracing::warn!(reason = %accel.reason, "microvm driver without KVM");
    } else {
        tracing::info!(reason = %accel.reason, "microvm driver");
    }
    Ok(vm)
}

/// `bulkhead/<instance>`: each data dir gets its own cgroup subtree, so a server reclaiming
/// leftovers never touches another server's sandboxes on the same host.
fn cgroup_parent(data_dir: &Path) -> String {
    use sha2::Digest;
    let canonical = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    format!("bulkhead/{}", &hex::encode(digest)[..8])
}

/// The configured CRIU if it runs here; otherwise None, said loudly (pause, snapshots and fork
/// then answer with how to enable them).
fn usable_criu(criu: Option<&std::path::Path>) -> Option<PathBuf> {
    let Some(path) = criu else {
        tracing::warn!(
            "no CRIU configured: pause, resume with memory, snapshots and fork are disabled; \
             build it with scripts/criu.sh and pass --criu <path> (or BULKHEAD_CRIU)"
        );
        return None;
    };
    match bulkhead_jail::criu::Criu::check(path) {
        Ok(version) => {
            tracing::info!(criu = %path.display(), %version, "checkpoint/restore enabled");
            Some(path.to_path_buf())
        }
        Err(e) => {
            tracing::error!(criu = %path.display(), error = %e, "CRIU does not run: pause, snapshots and fork are disabled");
            None
        }
    }
}
