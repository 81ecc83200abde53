//! The node's warm pools: started, anonymous sandboxes per template, oldest first. How big each
//! should be is the control plane's decision (`crate::pool`); this only holds them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use crate::node::driver::DriverHandle;

#[derive(Default)]
pub(crate) struct Pools(Mutex<HashMap<String, VecDeque<DriverHandle>>>);

impl Pools {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, VecDeque<DriverHandle>>) -> R) -> R {
        f(&mut self.0.lock().expect("pool lock"))
    }

    pub(crate) fn take(&self, template: &str) -> Option<DriverHandle> {
        self.with(|p| p.get_mut(template).and_then(|q| q.pop_front()))
    }

    pub(crate) fn put(&self, template: &str, handle: DriverHandle) {
        self.with(|p| p.entry(template.to_string()).or_default().push_back(handle));
    }

    pub(crate) fn take_surplus(&self, template: &str, n: usize) -> Vec<DriverHandle> {
        self.with(|p| {
            let Some(q) = p.get_mut(template) else {
                return Vec::new();
            };
            let keep = q.len().saturating_sub(n);
            q.split_off(keep).into_iter().rev().collect()
        })
    }

    pub(crate) fn drain(&self, template: Option<&str>) -> Vec<DriverHandle> {
        self.with(|p| match template {
            Some(t) => p.remove(t).map(Vec::from).unwrap_or_default(),
            None => p.drain().flat_map(|(_, q)| q).collect(),
        })
    }

    pub(crate) fn stock(&self) -> BTreeMap<String, usize> {
        self.with(|p| p.iter().map(|(t, q)| (t.clone(), q.len())).collect())
    }

    pub(crate) fn members(&self) -> Vec<DriverHandle> {
        self.with(|p| p.values().flatten().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(slot: u32) -> DriverHandle {
        DriverHandle {
            format: 2,
            driver: "fake".into(),
            pid: 1,
            pid_start_time: 0,
            slot,
            data: serde_json::Value::Null,
            node: None,
        }
    }

    #[test]
    fn oldest_is_claimed_first_and_surplus_goes_newest_first() {
        let p = Pools::default();
        for s in 1..=4 {
            p.put("base", h(s));
        }
        assert_eq!(p.take("base").map(|h| h.slot), Some(1));
        let surplus: Vec<u32> = p.take_surplus("base", 2).iter().map(|h| h.slot).collect();
        assert_eq!(surplus, vec![4, 3]);
        assert_eq!(p.stock().get("base"), Some(&1));
        assert_eq!(p.members().len(), 1);
        assert_eq!(p.drain(None).len(), 1);
        assert!(p.take("base").is_none());
        assert!(p.take_surplus("other", 3).is_empty());
    }
}
