//! The driver's data types: handles, specs, capabilities, checkpoints, changes and usage.

use bulkhead_driver::{
    Capabilities, ChangeKind, ChangeSource, CheckpointInfo, CheckpointOptions, DriverHandle,
    FileChange, NetworkLink, ResourceUsage, RestoreOptions, SandboxSpec, VolumeMount,
};

use super::{ConvertError, host_path, known, required, unset, wire_path};
use crate::v1;

impl From<&DriverHandle> for v1::DriverHandle {
    fn from(h: &DriverHandle) -> Self {
        v1::DriverHandle {
            format: h.format,
            driver: h.driver.clone(),
            pid: h.pid,
            pid_start_time: h.pid_start_time,
            slot: h.slot,
            data_json: h.data.to_string(),
            node: h.node.clone(),
        }
    }
}

impl TryFrom<v1::DriverHandle> for DriverHandle {
    type Error = ConvertError;

    fn try_from(h: v1::DriverHandle) -> Result<Self, ConvertError> {
        const FIELD: &str = "DriverHandle.data_json";
        if h.data_json.is_empty() {
            // Even a handle without data has `null` here: empty is a sender's mistake.
            return Err(ConvertError::MissingField { field: FIELD });
        }
        let data = serde_json::from_str(&h.data_json).map_err(|source| ConvertError::BadJson {
            field: FIELD,
            source,
        })?;
        Ok(DriverHandle {
            format: h.format,
            driver: h.driver,
            pid: h.pid,
            pid_start_time: h.pid_start_time,
            slot: h.slot,
            data,
            node: h.node,
        })
    }
}

/// A handle field a request or response must have.
pub fn handle(
    h: Option<v1::DriverHandle>,
    field: &'static str,
) -> Result<DriverHandle, ConvertError> {
    required(h, field)?.try_into()
}

impl TryFrom<&VolumeMount> for v1::VolumeMount {
    type Error = ConvertError;

    fn try_from(v: &VolumeMount) -> Result<Self, ConvertError> {
        Ok(v1::VolumeMount {
            name: v.name.clone(),
            host_dir: wire_path(&v.host_dir, "VolumeMount.host_dir")?,
            path: v.path.clone(),
        })
    }
}

impl TryFrom<v1::VolumeMount> for VolumeMount {
    type Error = ConvertError;

    fn try_from(v: v1::VolumeMount) -> Result<Self, ConvertError> {
        Ok(VolumeMount {
            name: v.name,
            host_dir: host_path(v.host_dir, "VolumeMount.host_dir")?,
            path: v.path,
        })
    }
}

impl TryFrom<&SandboxSpec> for v1::SandboxSpec {
    type Error = ConvertError;

    fn try_from(s: &SandboxSpec) -> Result<Self, ConvertError> {
        Ok(v1::SandboxSpec {
            template_id: s.template_id.clone(),
            rootfs: wire_path(&s.rootfs, "SandboxSpec.rootfs")?,
            cpu_count: s.cpu_count,
            memory_mb: s.memory_mb,
            pids_max: s.pids_max,
            disk_mb: s.disk_mb,
            volumes: s
                .volumes
                .iter()
                .map(TryInto::try_into)
                .collect::<Result<_, _>>()?,
        })
    }
}

impl TryFrom<v1::SandboxSpec> for SandboxSpec {
    type Error = ConvertError;

    fn try_from(s: v1::SandboxSpec) -> Result<Self, ConvertError> {
        Ok(SandboxSpec {
            template_id: s.template_id,
            rootfs: host_path(s.rootfs, "SandboxSpec.rootfs")?,
            cpu_count: s.cpu_count,
            memory_mb: s.memory_mb,
            pids_max: s.pids_max,
            disk_mb: s.disk_mb,
            volumes: s
                .volumes
                .into_iter()
                .map(TryInto::try_into)
                .collect::<Result<_, _>>()?,
        })
    }
}

impl From<NetworkLink> for v1::NetworkLink {
    fn from(l: NetworkLink) -> Self {
        match l {
            NetworkLink::None => v1::NetworkLink::None,
            NetworkLink::TunInNetns => v1::NetworkLink::TunInNetns,
            NetworkLink::VmNic => v1::NetworkLink::VmNic,
        }
    }
}

impl TryFrom<v1::NetworkLink> for NetworkLink {
    type Error = ConvertError;

    fn try_from(l: v1::NetworkLink) -> Result<Self, ConvertError> {
        Ok(match l {
            v1::NetworkLink::None => NetworkLink::None,
            v1::NetworkLink::TunInNetns => NetworkLink::TunInNetns,
            v1::NetworkLink::VmNic => NetworkLink::VmNic,
            v1::NetworkLink::Unspecified => {
                return Err(unset("Capabilities.network", "NetworkLink"));
            }
        })
    }
}

impl From<&Capabilities> for v1::Capabilities {
    fn from(c: &Capabilities) -> Self {
        v1::Capabilities {
            freeze: c.freeze,
            checkpoint: c.checkpoint,
            snapshot: c.snapshot,
            network: v1::NetworkLink::from(c.network).into(),
            warm_start: c.warm_start,
            changes: c.changes,
            export_changes: c.export_changes,
            checkpoint_key: c.checkpoint_key,
        }
    }
}

impl TryFrom<v1::Capabilities> for Capabilities {
    type Error = ConvertError;

    fn try_from(c: v1::Capabilities) -> Result<Self, ConvertError> {
        let network: v1::NetworkLink = known(c.network, "Capabilities.network", "NetworkLink")?;
        Ok(Capabilities {
            freeze: c.freeze,
            checkpoint: c.checkpoint,
            snapshot: c.snapshot,
            network: network.try_into()?,
            warm_start: c.warm_start,
            changes: c.changes,
            export_changes: c.export_changes,
            checkpoint_key: c.checkpoint_key,
        })
    }
}

impl From<&CheckpointOptions> for v1::CheckpointOptions {
    fn from(o: &CheckpointOptions) -> Self {
        v1::CheckpointOptions {
            leave_running: o.leave_running,
            filesystem_only: o.filesystem_only,
        }
    }
}

impl From<v1::CheckpointOptions> for CheckpointOptions {
    fn from(o: v1::CheckpointOptions) -> Self {
        CheckpointOptions {
            leave_running: o.leave_running,
            filesystem_only: o.filesystem_only,
        }
    }
}

impl From<&RestoreOptions> for v1::RestoreOptions {
    fn from(o: &RestoreOptions) -> Self {
        v1::RestoreOptions {
            consume: o.consume,
            filesystem_only: o.filesystem_only,
            access_token: o.access_token.clone(),
        }
    }
}

impl From<v1::RestoreOptions> for RestoreOptions {
    fn from(o: v1::RestoreOptions) -> Self {
        RestoreOptions {
            consume: o.consume,
            filesystem_only: o.filesystem_only,
            access_token: o.access_token,
        }
    }
}

impl TryFrom<&CheckpointInfo> for v1::CheckpointInfo {
    type Error = ConvertError;

    fn try_from(i: &CheckpointInfo) -> Result<Self, ConvertError> {
        Ok(v1::CheckpointInfo {
            driver: i.driver.clone(),
            format: i.format,
            dir: wire_path(&i.dir, "CheckpointInfo.dir")?,
            size_bytes: i.size_bytes,
            memory: i.memory,
        })
    }
}

impl TryFrom<v1::CheckpointInfo> for CheckpointInfo {
    type Error = ConvertError;

    fn try_from(i: v1::CheckpointInfo) -> Result<Self, ConvertError> {
        Ok(CheckpointInfo {
            driver: i.driver,
            format: i.format,
            dir: host_path(i.dir, "CheckpointInfo.dir")?,
            size_bytes: i.size_bytes,
            memory: i.memory,
        })
    }
}

impl From<ChangeKind> for v1::ChangeKind {
    fn from(k: ChangeKind) -> Self {
        match k {
            ChangeKind::Created => v1::ChangeKind::Created,
            ChangeKind::Modified => v1::ChangeKind::Modified,
            ChangeKind::Deleted => v1::ChangeKind::Deleted,
        }
    }
}

impl From<&FileChange> for v1::FileChange {
    fn from(c: &FileChange) -> Self {
        v1::FileChange {
            path: c.path.clone(),
            kind: v1::ChangeKind::from(c.kind).into(),
            file_type: c.file_type.clone(),
            size: c.size,
            mtime: c.mtime,
        }
    }
}

impl TryFrom<v1::FileChange> for FileChange {
    type Error = ConvertError;

    fn try_from(c: v1::FileChange) -> Result<Self, ConvertError> {
        const FIELD: &str = "FileChange.kind";
        let kind = match known(c.kind, FIELD, "ChangeKind")? {
            v1::ChangeKind::Created => ChangeKind::Created,
            v1::ChangeKind::Modified => ChangeKind::Modified,
            v1::ChangeKind::Deleted => ChangeKind::Deleted,
            v1::ChangeKind::Unspecified => return Err(unset(FIELD, "ChangeKind")),
        };
        Ok(FileChange {
            path: c.path,
            kind,
            file_type: c.file_type,
            size: c.size,
            mtime: c.mtime,
        })
    }
}

impl TryFrom<&ChangeSource> for v1::ChangeSource {
    type Error = ConvertError;

    fn try_from(s: &ChangeSource) -> Result<Self, ConvertError> {
        let source = match s {
            ChangeSource::Running(h) => v1::change_source::Source::Running(h.into()),
            ChangeSource::Checkpoint(dir) => {
                v1::change_source::Source::Checkpoint(wire_path(dir, "ChangeSource.checkpoint")?)
            }
        };
        Ok(v1::ChangeSource {
            source: Some(source),
        })
    }
}

impl TryFrom<v1::ChangeSource> for ChangeSource {
    type Error = ConvertError;

    fn try_from(s: v1::ChangeSource) -> Result<Self, ConvertError> {
        Ok(match required(s.source, "ChangeSource.source")? {
            v1::change_source::Source::Running(h) => ChangeSource::Running(h.try_into()?),
            v1::change_source::Source::Checkpoint(dir) => {
                ChangeSource::Checkpoint(host_path(dir, "ChangeSource.checkpoint")?)
            }
        })
    }
}

impl From<&ResourceUsage> for v1::ResourceUsage {
    fn from(u: &ResourceUsage) -> Self {
        v1::ResourceUsage {
            cpu_usage_ns: u.cpu_usage_ns,
            mem_used_bytes: u.mem_used_bytes,
            mem_cache_bytes: u.mem_cache_bytes,
            mem_limit_bytes: u.mem_limit_bytes,
            disk_used_bytes: u.disk_used_bytes,
            disk_total_bytes: u.disk_total_bytes,
            pids_current: u.pids_current,
        }
    }
}

impl From<v1::ResourceUsage> for ResourceUsage {
    fn from(u: v1::ResourceUsage) -> Self {
        ResourceUsage {
            cpu_usage_ns: u.cpu_usage_ns,
            mem_used_bytes: u.mem_used_bytes,
            mem_cache_bytes: u.mem_cache_bytes,
            mem_limit_bytes: u.mem_limit_bytes,
            disk_used_bytes: u.disk_used_bytes,
            disk_total_bytes: u.disk_total_bytes,
            pids_current: u.pids_current,
        }
    }
}
