//! What the router has promised each member, between the directory's answers: starts under way
//! (always counted), starts and pool claims since the last answer (counted against a node's own
//! report until its next one includes them), and, for a directory that knows only capacity, the
//! sandboxes it started and that have not ended.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::cluster::placement::{NodeLoad, Request};
use crate::node::driver::DriverHandle;

#[derive(Default)]
pub(super) struct Ledger(Mutex<Books>);

#[derive(Default)]
struct Books {
    next_ticket: u64,
    /// Starts under way: ticket → (member, request).
    in_flight: HashMap<u64, (String, Request)>,
    /// Starts done since the directory last answered, by sandbox (one that has ended since is
    /// dropped: a burst of short-lived sandboxes must not fill a node on paper).
    placed: Vec<(Key, String, Request)>,
    /// Pool members claimed since the directory last answered: (member, template).
    claimed: Vec<(String, String)>,
    /// Sandboxes started through the router and not ended: (vCPUs, MiB) on their member.
    running: HashMap<Key, (String, f64, u64)>,
}

/// A sandbox's identity: its member, driver, pid and the pid's start time.
type Key = (String, String, i32, u64);

fn key(h: &DriverHandle) -> Key {
    (
        h.node.clone().unwrap_or_default(),
        h.driver.clone(),
        h.pid,
        h.pid_start_time,
    )
}

impl Ledger {
    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.0.lock().expect("ledger lock")
    }

    /// A start of `req` on `member` begins.
    pub(super) fn reserve(&self, member: &str, req: &Request) -> u64 {
        let mut b = self.books();
        b.next_ticket += 1;
        let ticket = b.next_ticket;
        b.in_flight
            .insert(ticket, (member.to_string(), req.clone()));
        ticket
    }

    /// The start failed.
    pub(super) fn release(&self, ticket: u64) {
        self.books().in_flight.remove(&ticket);
    }

    /// The start succeeded: `handle` (naming its member) runs what was reserved.
    pub(super) fn started(&self, ticket: u64, handle: &DriverHandle) {
        let mut b = self.books();
        if let Some((member, req)) = b.in_flight.remove(&ticket) {
            b.running
                .insert(key(handle), (member.clone(), req.cpus, req.memory_mib));
            b.placed.push((key(handle), member, req));
        }
    }

    /// A warm member of `template`'s pool on `member` was handed out.
    pub(super) fn claimed(&self, member: &str, template: &str) {
        self.books()
            .claimed
            .push((member.to_string(), template.to_string()));
    }

    /// The sandbox has ended (stopped, died, checkpointed away, exported).
    pub(super) fn ended(&self, handle: &DriverHandle) {
        let mut b = self.books();
        let k = key(handle);
        b.running.remove(&k);
        b.placed.retain(|(p, ..)| *p != k);
    }

    /// The directory answered anew: its reports now include what was placed before.
    pub(super) fn refreshed(&self) {
        let mut b = self.books();
        b.placed.clear();
        b.claimed.clear();
    }

    /// Adds what the router knows and the directory does not yet to `loads`.
    pub(super) fn apply(&self, loads: &mut [NodeLoad], self_reported: bool) {
        let b = self.books();
        for load in loads.iter_mut() {
            let id = load.id.clone();
            for (_, req) in b.in_flight.values().filter(|(m, _)| *m == id) {
                load.reserve(req);
            }
            if self_reported {
                for (_, _, req) in b.placed.iter().filter(|(_, m, _)| *m == id) {
                    load.reserve(req);
                }
                for (_, template) in b.claimed.iter().filter(|(m, _)| *m == id) {
                    if let Some(n) = load.warm.get_mut(template) {
                        *n = n.saturating_sub(1);
                    }
                }
            } else {
                for (_, cpus, mib) in b.running.values().filter(|(m, ..)| *m == id) {
                    load.cpu_allocated += cpus;
                    load.memory_allocated_mib += mib;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::placement::NodeStatus;

    fn load(id: &str) -> NodeLoad {
        NodeLoad {
            id: id.into(),
            status: NodeStatus::Ready,
            cpus: 8.0,
            memory_mib: 8192,
            cpu_allocated: 1.0,
            memory_allocated_mib: 100,
            cpu_in_flight: 0.0,
            memory_in_flight_mib: 0,
            cpu_used: 0.0,
            warm: [("base".to_string(), 2)].into(),
            cached: Default::default(),
            checkpoint_key: None,
        }
    }

    fn req() -> Request {
        Request {
            template: "t".into(),
            cpus: 2.0,
            memory_mib: 512,
            checkpoint_key: None,
            preferred: None,
        }
    }

    fn handle(node: &str, pid: i32) -> DriverHandle {
        let mut h = DriverHandle::new("fake", pid, 1, 0, serde_json::Value::Null);
        h.node = Some(node.into());
        h
    }

    #[test]
    fn counts_starts_until_they_end_or_a_report_includes_them() {
        let ledger = Ledger::default();
        let a = ledger.reserve("a", &req());
        let b = ledger.reserve("b", &req());
        let mut loads = [load("a"), load("b")];
        ledger.apply(&mut loads, true);
        assert_eq!((loads[0].cpu_in_flight, loads[1].cpu_in_flight), (2.0, 2.0));

        ledger.release(b);
        ledger.started(a, &handle("a", 7));
        ledger.claimed("b", "base");
        // A node's own report: placed since it count as in flight, claims take from its pool.
        let mut reported = [load("a"), load("b")];
        ledger.apply(&mut reported, true);
        assert_eq!(reported[0].cpu_in_flight, 2.0);
        assert_eq!(reported[0].cpu_allocated, 1.0);
        assert_eq!(reported[1].cpu_in_flight, 0.0);
        assert_eq!(reported[1].warm["base"], 1);
        // Capacity only: what runs is counted as allocated.
        let mut counted = [load("a"), load("b")];
        ledger.apply(&mut counted, false);
        assert_eq!(
            (counted[0].cpu_allocated, counted[0].memory_allocated_mib),
            (3.0, 612)
        );
        assert_eq!(counted[0].cpu_in_flight, 0.0);

        // The next report includes the start; an end frees what was counted.
        ledger.refreshed();
        let mut next = [load("a")];
        ledger.apply(&mut next, true);
        assert_eq!(next[0].cpu_in_flight, 0.0);
        ledger.ended(&handle("a", 7));
        let mut after = [load("a")];
        ledger.apply(&mut after, false);
        assert_eq!(after[0].cpu_allocated, 1.0);
    }

    #[test]
    fn a_sandbox_that_ended_before_the_next_report_is_not_counted() {
        // A burst of create-then-kill within one report period: what ended frees its place at
        // once, or the node fills on paper (seen in the cluster SDK test).
        let ledger = Ledger::default();
        for pid in 1..=10 {
            let t = ledger.reserve("a", &req());
            ledger.started(t, &handle("a", pid));
            ledger.ended(&handle("a", pid));
        }
        let still = ledger.reserve("a", &req());
        ledger.started(still, &handle("a", 99));
        let mut loads = [load("a")];
        ledger.apply(&mut loads, true);
        assert_eq!(loads[0].cpu_in_flight, 2.0, "only the one still running");
    }
}
