//! Per-team state the engine keeps in memory: create token buckets, creates in flight (so two
//! concurrent creates cannot both take a team's last sandbox), when each key's last use was
//! written, and since when each team has been out of credits. Leaf module.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::tenancy::metering::Exhaustion;
use crate::tenancy::quota::TokenBucket;

/// A key's last use is written to the store at most this often.
pub(crate) const TOUCH_EVERY_MS: i64 = 60_000;

#[derive(Default)]
pub(crate) struct Tenants {
    pub(crate) buckets: Mutex<HashMap<String, TokenBucket>>,
    pub(crate) creating: Arc<Mutex<HashMap<String, i64>>>,
    /// Key id → unix ms of the last write of its `last_used_at`.
    pub(crate) touched: Mutex<HashMap<String, i64>>,
    pub(crate) exhaustion: Mutex<Exhaustion>,
    /// Serialises metering writes (the interval loop and a sandbox's final interval), so no
    /// interval is recorded twice.
    pub(crate) meter_lock: tokio::sync::Mutex<()>,
}

impl Tenants {
    /// Should a request with `key_id` at `now_ms` write its last use? Notes it if so.
    pub(crate) fn touch_due(&self, key_id: &str, now_ms: i64) -> bool {
        let mut t = self.touched.lock().expect("touched lock");
        match t.get(key_id) {
            Some(&at) if now_ms - at < TOUCH_EVERY_MS => false,
            _ => {
                t.insert(key_id.to_owned(), now_ms);
                true
            }
        }
    }

    /// Counts a create of `team` in flight until the returned guard drops.
    pub(crate) fn start_create(&self, team: &str) -> CreateSlot {
        *self
            .creating
            .lock()
            .expect("creating lock")
            .entry(team.to_owned())
            .or_default() += 1;
        CreateSlot {
            creating: self.creating.clone(),
            team: team.to_owned(),
        }
    }

    pub(crate) fn creating(&self, team: &str) -> i64 {
        self.creating
            .lock()
            .expect("creating lock")
            .get(team)
            .copied()
            .unwrap_or(0)
    }
}

/// A create of a team in flight (see [`Tenants::start_create`]).
pub(crate) struct CreateSlot {
    creating: Arc<Mutex<HashMap<String, i64>>>,
    team: String,
}

impl Drop for CreateSlot {
    fn drop(&mut self) {
        let mut c = self.creating.lock().expect("creating lock");
        if let Some(n) = c.get_mut(&self.team) {
            *n -= 1;
            if *n <= 0 {
                c.remove(&self.team);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_use_is_written_at_most_once_a_minute() {
        let t = Tenants::default();
        assert!(t.touch_due("k", 0));
        assert!(!t.touch_due("k", 59_999));
        assert!(t.touch_due("other", 1));
        assert!(t.touch_due("k", 60_000));
    }

    #[test]
    fn creates_in_flight_are_counted_until_done() {
        let t = Tenants::default();
        let a = t.start_create("x");
        let b = t.start_create("x");
        assert_eq!(t.creating("x"), 2);
        drop(a);
        assert_eq!(t.creating("x"), 1);
        drop(b);
        assert_eq!(t.creating("x"), 0);
        assert!(t.creating.lock().unwrap().is_empty());
    }
}
