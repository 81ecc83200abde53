//! Console sessions: a random id in an HttpOnly cookie maps, in this server's memory only, to
//! the API key the user logged in with. The key never goes back to the browser; every console
//! request re-authenticates it, so a revoked key ends its sessions at their next request.
//! Sessions end after an hour without use or twelve hours in all, and with the server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A session unused this long is gone.
pub const IDLE: Duration = Duration::from_secs(3600);
/// No session lives longer than this, used or not.
pub const ABSOLUTE: Duration = Duration::from_secs(12 * 3600);
/// More live sessions than this and the least recently used one is dropped for a new login.
const MAX_SESSIONS: usize = 10_000;

struct Session {
    key: String,
    created: Instant,
    last_seen: Instant,
}

impl Session {
    fn alive(&self, now: Instant) -> bool {
        now.duration_since(self.created) < ABSOLUTE && now.duration_since(self.last_seen) < IDLE
    }
}

#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for `key`; returns its id (256 random bits, hex).
    pub fn create(&self, key: String, now: Instant) -> String {
        let id = bulkhead_engine::ids::random_hex(32);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.alive(now));
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            id.clone(),
            Session {
                key,
                created: now,
                last_seen: now,
            },
        );
        id
    }

    /// The key of live session `id` (and marks it used), or None.
    pub fn key(&self, id: &str, now: Instant) -> Option<String> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(id) {
            Some(s) if s.alive(now) => {
                s.last_seen = now;
                Some(s.key.clone())
            }
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    pub fn remove(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_when_idle_or_old_and_can_be_removed() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let id = s.create("e2b_k".into(), t0);
        assert_eq!(id.len(), 64);
        assert_eq!(s.key(&id, t0 + IDLE / 2).as_deref(), Some("e2b_k"));
        // Used half an idle period ago: still alive after another almost-idle period.
        assert!(
            s.key(&id, t0 + IDLE / 2 + IDLE - Duration::from_secs(1))
                .is_some()
        );
        assert!(s.key(&id, t0 + IDLE * 3).is_none());
        assert_eq!(s.len(), 0, "an expired session is dropped when seen");

        let id = s.create("e2b_k".into(), t0);
        let mut t = t0;
        while t < t0 + ABSOLUTE - IDLE {
            t += IDLE / 2;
            assert!(s.key(&id, t).is_some());
        }
        assert!(
            s.key(&id, t0 + ABSOLUTE).is_none(),
            "kept in use, still ends"
        );

        let id = s.create("e2b_k".into(), t0);
        s.remove(&id);
        assert!(s.key(&id, t0).is_none());
        assert!(s.key("not-a-session", t0).is_none());
    }
}
