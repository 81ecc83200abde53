//! What a node's sandboxes were promised: the vCPUs and memory of every sandbox it started or
//! restored, until it is stopped or dies. A node's heartbeat reports it, so placement across a
//! cluster weighs what each node has committed rather than what it happens to use now.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::node::driver::{DriverHandle, SandboxSpec};

/// Totals of [`Tally`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Allocation {
    /// Sandboxes handed out (warm members not yet claimed are apart).
    pub sandboxes: u64,
    pub cpus: f64,
    pub memory_mib: u64,
    /// Warm pool members: started, not yet claimed (they hold memory, little CPU).
    pub warm: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// By process identity (pid and its start time: a recycled pid is another sandbox).
    entries: Mutex<HashMap<(i32, u64), Entry>>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    cpus: u32,
    memory_mib: u64,
    warm: bool,
}

fn key(h: &DriverHandle) -> (i32, u64) {
    (h.pid, h.pid_start_time)
}

impl Tally {
    pub(crate) fn started(&self, h: &DriverHandle, spec: &SandboxSpec, warm: bool) {
        self.lock().insert(
            key(h),
            Entry {
                cpus: spec.cpu_count,
                memory_mib: spec.memory_mb,
                warm,
            },
        );
    }

    pub(crate) fn claimed(&self, h: &DriverHandle) {
        if let Some(e) = self.lock().get_mut(&key(h)) {
            e.warm = false;
        }
    }

    pub(crate) fn gone(&self, h: &DriverHandle) {
        self.lock().remove(&key(h));
    }

    pub(crate) fn total(&self) -> Allocation {
        let mut a = Allocation::default();
        for e in self.lock().values() {
            if e.warm {
                a.warm += 1;
            } else {
                a.sandboxes += 1;
                a.cpus += f64::from(e.cpus);
                a.memory_mib += e.memory_mib;
            }
        }
        a
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(i32, u64), Entry>> {
        // Each update is one map operation: a panic elsewhere leaves it consistent.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
