//! This process's own report, as a node of a cluster sends it in every heartbeat: the host's
//! capacity, what its running sandboxes were promised, its warm pools and the templates whose
//! trees it has.

use std::collections::BTreeSet;

use crate::lifecycle::SandboxState;
use crate::{Engine, LocalNode, Node};

use super::report::NodeReport;

impl Engine {
    /// What this node reports about itself now.
    pub fn node_report(&self) -> NodeReport {
        let (mut cpu, mut mem, mut running) = (0.0, 0u64, 0u64);
        for l in self.live.lock().values() {
            // A paused sandbox holds disk, not CPU or memory.
            if l.handle.is_some() && l.state != SandboxState::Paused {
                cpu += l.meter.vcpus.max(0) as f64;
                mem += l.meter.memory_mb.max(0) as u64;
                running += 1;
            }
        }
        let cpus = host_cpus();
        NodeReport {
            version: env!("CARGO_PKG_VERSION").to_string(),
            driver: self.node.driver_name(),
            cpus,
            memory_mib: host_memory_mib().unwrap_or(0),
            cpu_allocated: cpu,
            memory_allocated_mib: mem,
            cpu_used: load_average().unwrap_or(0.0).min(cpus),
            sandboxes: running,
            starts_in_flight: self.admission.in_flight() as u64,
            warm: self
                .node
                .pool_stock()
                .into_iter()
                .map(|(t, n)| (t, u32::try_from(n).unwrap_or(u32::MAX)))
                .collect(),
            cached: self.templates().iter().map(|t| t.id.clone()).collect(),
            checkpoint_key: self.node.checkpoint_key(),
            egress: self.node.has_egress(),
        }
    }
}

impl NodeReport {
    /// The report of a node daemon: `node`'s own tally of what it started, its pools, and
    /// `cached`, the templates whose trees it holds.
    pub fn of_local(node: &LocalNode, cached: BTreeSet<String>, starts_in_flight: u64) -> Self {
        let a = node.allocated();
        let cpus = host_cpus();
        NodeReport {
            version: env!("CARGO_PKG_VERSION").to_string(),
            driver: node.driver_name(),
            cpus,
            memory_mib: host_memory_mib().unwrap_or(0),
            cpu_allocated: a.cpus,
            memory_allocated_mib: a.memory_mib,
            cpu_used: load_average().unwrap_or(0.0).min(cpus),
            sandboxes: a.sandboxes,
            starts_in_flight,
            warm: node
                .pool_stock()
                .into_iter()
                .map(|(t, n)| (t, u32::try_from(n).unwrap_or(u32::MAX)))
                .collect(),
            cached,
            checkpoint_key: node.checkpoint_key(),
            egress: node.has_egress(),
        }
    }
}

fn host_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// MemTotal from /proc/meminfo.
fn host_memory_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// The one-minute load average: runnable threads, a measure of CPU use in vCPUs.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
