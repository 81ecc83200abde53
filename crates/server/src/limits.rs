//! How many client connections the HTTP listener holds, and who gets the last ones:
//! [`ConnectionLimits`] (the `--http-*` flags), resolved against the open-files limit into
//! [`Resolved`], and the [`Gate`] every accepted connection passes. Logic only (no sockets), so
//! the accounting is tested without a listener.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

/// Descriptors kept for the server itself (store, logs, image cache, CRIU, template builds).
const SERVER_FDS: u64 = 1024;
/// Descriptors one sandbox may hold in the server (pidfd, agent streams, netns, pool state).
const FDS_PER_SANDBOX: u64 = 16;
/// The smallest connection cap that still leaves a usable reserve.
const MIN_CONNECTIONS: usize = 64;
/// How long a connection in the reserve has to show a request head that qualifies.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connection in the reserve is safe from eviction: a client that sends its head at
/// once must get it read even when a loaded host runs the connection's task late (a flood of
/// 3,000 new connections a second evicted probes after 40 ms without it, and reset clients
/// whose request was already in the socket).
const PROBE_GRACE: Duration = Duration::from_millis(100);

/// The HTTP listener's bounds (`--http-*` flags on `bulkhead serve`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most client connections open at once; `None`: what the open-files limit leaves after
    /// the server's own descriptors and its sandboxes'.
    pub max_connections: Option<usize>,
    /// Most connections from one source address (0: no per-address cap).
    pub max_per_ip: usize,
    /// The last slots under the cap, kept for connections whose first request is `/health`,
    /// carries a valid API key or goes to a running sandbox.
    pub reserved: usize,
    /// A request head must arrive within this from the connection's start or from the end of
    /// its previous response (an idle HTTP/1.1 keep-alive connection is closed after it).
    pub header_timeout: Duration,
    /// A connection with no request in flight (an HTTP/2 connection without streams) is
    /// closed after this.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: None,
            max_per_ip: 1024,
            reserved: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Connection limits the server cannot start with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitsError {
    #[error(
        "--http-reserved-connections ({reserved}) must be below --http-max-connections ({max}): lower the reserve or raise the cap"
    )]
    ReserveAboveMax { reserved: usize, max: usize },
    #[error("--http-max-connections must be at least {MIN_CONNECTIONS}")]
    TooFewConnections,
    #[error("{0} must be at least 1 second")]
    ZeroTimeout(&'static str),
}

/// [`ConnectionLimits`] with the cap settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub max: usize,
    pub max_per_ip: usize,
    pub reserved: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// How long a reserve connection gets to show its request head.
    pub probe_timeout: Duration,
    /// Reserve connections being checked at once; a new one evicts the oldest beyond this, so
    /// an idle flood that reaches the reserve holds none of it for long.
    pub max_probing: usize,
    /// A probe younger than this is not evicted (the reserve then holds more than
    /// `max_probing` for a moment, or a newcomer to a full gate is refused).
    pub probe_grace: Duration,
}

impl ConnectionLimits {
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.header_timeout.is_zero() {
            return Err(LimitsError::ZeroTimeout("--http-header-timeout"));
        }
        if self.idle_timeout.is_zero() {
            return Err(LimitsError::ZeroTimeout("--http-idle-timeout"));
        }
        if let Some(max) = self.max_connections {
            if max < MIN_CONNECTIONS {
                return Err(LimitsError::TooFewConnections);
            }
            if self.reserved >= max {
                return Err(LimitsError::ReserveAboveMax {
                    reserved: self.reserved,
                    max,
                });
            }
        }
        Ok(())
    }

    /// The limits for a process allowed `nofile` descriptors that runs up to `sandboxes`
    /// sandboxes (running and warm). A derived cap never goes below [`MIN_CONNECTIONS`] (the
    /// accept loop then backs off on EMFILE instead) and the reserve is at most a quarter of it.
    pub fn resolve(&self, nofile: u64, sandboxes: u64) -> Resolved {
        let max = self.max_connections.unwrap_or_else(|| {
            let left =
                nofile.saturating_sub(SERVER_FDS + sandboxes.saturating_mul(FDS_PER_SANDBOX));
            usize::try_from(left)
                .unwrap_or(usize::MAX)
                .max(MIN_CONNECTIONS)
        });
        let reserved = self.reserved.min(max / 4);
        Resolved {
            max,
            max_per_ip: self.max_per_ip,
            reserved,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            probe_timeout: PROBE_TIMEOUT.min(self.header_timeout),
            max_probing: (reserved / 4).max(1),
            probe_grace: PROBE_GRACE,
        }
    }
}

/// Why a connection was closed at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its address already holds `max_per_ip` connections.
    PerAddress,
    /// Every slot, the reserve included, is taken.
    Full,
}

/// What the gate decided for an accepted connection.
#[derive(Debug)]
pub enum Admission {
    /// Below the reserve: serve it.
    Open(Slot),
    /// In the reserve: serve it only if its first request qualifies.
    Reserve(Slot),
    Refused(Refusal),
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// Counts open connections, in total and per address. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Gate {
    limits: Arc<Resolved>,
    counts: Arc<Mutex<Counts>>,
    probes: Arc<Mutex<Probes>>,
}

/// One admitted connection's place; dropping it frees the place.
#[derive(Debug)]
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_ip.remove(&self.ip);
            }
        }
    }
}

impl Gate {
    pub fn new(limits: Resolved) -> Self {
        Gate {
            limits: Arc::new(limits),
            counts: Arc::default(),
            probes: Arc::default(),
        }
    }

    pub fn limits(&self) -> &Resolved {
        &self.limits
    }

    /// Decides for a connection from `ip`. IPv4-mapped IPv6 addresses count as their IPv4
    /// address, so a dual-stack listener cannot be used to double the per-address cap. With
    /// every slot taken, the oldest reserve connection still being checked gives its slot to
    /// this one: a connection that has shown nothing yet holds no claim over a newer one, and
    /// a flood that fills the reserve cannot shut out a client that would qualify.
    pub fn admit(&self, ip: IpAddr) -> Admission {
        let ip = ip.to_canonical();
        match self.try_admit(ip) {
            Err(Refusal::Full) if self.evict_oldest() => {
                self.try_admit(ip).unwrap_or_else(Admission::Refused)
            }
            r => r.unwrap_or_else(Admission::Refused),
        }
    }

    fn try_admit(&self, ip: IpAddr) -> Result<Admission, Refusal> {
        let l = &self.limits;
        let mut c = lock(&self.counts);
        let from_ip = c.per_ip.get(&ip).copied().unwrap_or(0);
        if l.max_per_ip > 0 && from_ip >= l.max_per_ip {
            return Err(Refusal::PerAddress);
        }
        if c.total >= l.max {
            return Err(Refusal::Full);
        }
        let in_reserve = c.total >= l.max - l.reserved;
        c.total += 1;
        *c.per_ip.entry(ip).or_insert(0) += 1;
        drop(c);
        let slot = Slot {
            counts: self.counts.clone(),
            ip,
        };
        Ok(if in_reserve {
            Admission::Reserve(slot)
        } else {
            Admission::Open(slot)
        })
    }

    /// Takes the slot of the oldest reserve connection being checked, if it is past its grace,
    /// and tells it to give up. False when there is none.
    fn evict_oldest(&self) -> bool {
        // Popped under the probes lock, dropped after it: a slot's drop takes the counts lock,
        // and `try_admit` holds that one alone.
        let grace = self.limits.probe_grace;
        let oldest = {
            let mut p = lock(&self.probes);
            match p.waiting.front() {
                Some(w) if w.since.elapsed() >= grace => p.waiting.pop_front(),
                _ => None,
            }
        };
        match oldest {
            Some(entry) => {
                entry.evict();
                true
            }
            None => false,
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.counts).total
    }

    /// Registers a reserve connection being checked; the probe holds its slot until
    /// [`Probe::finish`]. When `max_probing` are already being checked the oldest is told to
    /// give up (its receiver fires) and its slot is freed at once, so a flood of silent
    /// connections keeps cycling through the probe instead of holding it.
    pub fn start_probe(&self, slot: Slot) -> Probe {
        let (tx, rx) = oneshot::channel();
        let mut evicted = Vec::new();
        let id = {
            let mut p = lock(&self.probes);
            while p.waiting.len() >= self.limits.max_probing
                && p.waiting
                    .front()
                    .is_some_and(|w| w.since.elapsed() >= self.limits.probe_grace)
            {
                evicted.extend(p.waiting.pop_front());
            }
            p.next += 1;
            let id = p.next;
            p.waiting.push_back(Waiting {
                id,
                evict: tx,
                slot,
                since: std::time::Instant::now(),
            });
            id
        };
        // After the probes lock: freeing a slot takes the counts lock.
        evicted.into_iter().for_each(Waiting::evict);
        Probe {
            probes: self.probes.clone(),
            id,
            evicted: rx,
        }
    }
}

#[derive(Debug, Default)]
struct Probes {
    next: u64,
    waiting: VecDeque<Waiting>,
}

/// A reserve connection in the eviction queue, with the slot it holds.
#[derive(Debug)]
struct Waiting {
    id: u64,
    evict: oneshot::Sender<()>,
    slot: Slot,
    since: std::time::Instant,
}

impl Waiting {
    /// Frees the slot now and tells the connection to close.
    fn evict(self) {
        drop(self.slot);
        let _ = self.evict.send(());
    }
}

/// A reserve connection being checked; dropping it ends the check and frees its slot.
#[derive(Debug)]
pub struct Probe {
    probes: Arc<Mutex<Probes>>,
    id: u64,
    /// Fires when a newer connection took this one's place (its slot is gone by then).
    pub evicted: oneshot::Receiver<()>,
}

impl Probe {
    /// Ends the check: the slot back, or None when the connection was evicted meanwhile
    /// (then it must close: its slot is someone else's).
    pub fn finish(self) -> Option<Slot> {
        self.take()
    }

    fn take(&self) -> Option<Slot> {
        let mut p = lock(&self.probes);
        let i = p.waiting.iter().position(|w| w.id == self.id)?;
        p.waiting.remove(i).map(|w| w.slot)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // Outside the probes lock (see `start_probe`).
        drop(self.take());
    }
}

/// The counters stay consistent under a panic elsewhere (each update is one statement), so a
/// poisoned lock is used as is.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// Limits whose probes may be evicted at once (the grace has its own test).
    fn limits(max: usize, per_ip: usize, reserved: usize) -> Resolved {
        Resolved {
            probe_grace: Duration::ZERO,
            ..ConnectionLimits {
                max_connections: Some(max),
                max_per_ip: per_ip,
                reserved,
                ..ConnectionLimits::default()
            }
            .resolve(0, 0)
        }
    }

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
    }

    #[test]
    fn the_cap_comes_from_the_open_files_limit() {
        let d = ConnectionLimits::default();
        let r = d.resolve(20_000, 636);
        assert_eq!(r.max, 20_000 - 1024 - 636 * 16);
        assert_eq!(r.reserved, 512);
        // A tiny limit still gives a listener (the accept loop backs off on EMFILE).
        let r = d.resolve(1024, 500);
        assert_eq!(r.max, MIN_CONNECTIONS);
        assert_eq!(r.reserved, MIN_CONNECTIONS / 4);
    }

    #[test]
    fn validation_names_the_flag() {
        let bad = ConnectionLimits {
            max_connections: Some(100),
            reserved: 100,
            ..ConnectionLimits::default()
        };
        assert_eq!(
            bad.validate(),
            Err(LimitsError::ReserveAboveMax {
                reserved: 100,
                max: 100
            })
        );
        let bad = ConnectionLimits {
            header_timeout: Duration::ZERO,
            ..ConnectionLimits::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("--http-header-timeout")
        );
        assert!(ConnectionLimits::default().validate().is_ok());
    }

    #[test]
    fn the_last_slots_are_the_reserve_then_everything_is_refused() {
        let gate = Gate::new(limits(64, 0, 16));
        let mut held = Vec::new();
        for n in 0..48 {
            match gate.admit(ip((n % 200) as u8 + 1)) {
                Admission::Open(s) => held.push(s),
                other => panic!("connection {n}: {other:?}"),
            }
        }
        for n in 48..64 {
            match gate.admit(ip(1)) {
                Admission::Reserve(s) => held.push(s),
                other => panic!("connection {n}: {other:?}"),
            }
        }
        assert!(matches!(
            gate.admit(ip(9)),
            Admission::Refused(Refusal::Full)
        ));
        assert_eq!(gate.open(), 64);
        // Closing one below the reserve line makes an ordinary slot again.
        held.truncate(10);
        assert_eq!(gate.open(), 10);
        assert!(matches!(gate.admit(ip(9)), Admission::Open(_)));
    }

    #[test]
    fn one_address_gets_at_most_its_share() {
        let gate = Gate::new(limits(1000, 3, 16));
        let held: Vec<_> = (0..3)
            .map(|_| match gate.admit(ip(7)) {
                Admission::Open(s) => s,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(matches!(
            gate.admit(ip(7)),
            Admission::Refused(Refusal::PerAddress)
        ));
        // The same address written as IPv4-mapped IPv6 is the same address.
        let mapped = IpAddr::V6(Ipv4Addr::new(127, 0, 0, 7).to_ipv6_mapped());
        assert!(matches!(
            gate.admit(mapped),
            Admission::Refused(Refusal::PerAddress)
        ));
        assert!(matches!(gate.admit(ip(8)), Admission::Open(_)));
        drop(held);
        assert!(matches!(gate.admit(ip(7)), Admission::Open(_)));
    }

    fn reserve(gate: &Gate, n: u8) -> Slot {
        match gate.admit(ip(n)) {
            Admission::Reserve(s) => s,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_new_probe_evicts_the_oldest_beyond_the_limit_and_frees_its_slot() {
        // 16 reserved: 4 probes at once.
        let gate = Gate::new(limits(64, 0, 16));
        let _open: Vec<_> = (0..48).map(|n| gate.admit(ip(n + 1))).collect();
        let mut probes: Vec<_> = (0..4)
            .map(|n| gate.start_probe(reserve(&gate, n + 100)))
            .collect();
        for p in &mut probes {
            assert!(p.evicted.try_recv().is_err());
        }
        assert_eq!(gate.open(), 52);
        let _newer = gate.start_probe(reserve(&gate, 110));
        assert!(probes[0].evicted.try_recv().is_ok(), "the oldest gives way");
        assert!(probes[1].evicted.try_recv().is_err());
        // Its slot went with the eviction, before its connection closed.
        assert_eq!(gate.open(), 52);
        assert!(
            probes.remove(0).finish().is_none(),
            "an evicted probe has no slot"
        );
        // A finished probe frees its place in the queue without evicting anyone, and keeps
        // its slot for the connection it passes.
        let passed = probes.remove(0).finish().expect("not evicted");
        let _another = gate.start_probe(reserve(&gate, 111));
        for p in &mut probes {
            assert!(p.evicted.try_recv().is_err());
        }
        assert_eq!(gate.open(), 53);
        drop(passed);
        assert_eq!(gate.open(), 52);
        // A probe dropped unfinished (its task ended) frees its slot.
        drop(probes);
        assert_eq!(gate.open(), 50);
    }

    #[test]
    fn a_full_gate_gives_the_oldest_probes_slot_to_a_newcomer() {
        let gate = Gate::new(limits(64, 0, 16));
        let _open: Vec<_> = (0..48).map(|n| gate.admit(ip(n + 1))).collect();
        // 12 reserve connections that qualified, 4 still showing nothing.
        let passed: Vec<_> = (0..12)
            .map(|n| {
                gate.start_probe(reserve(&gate, n + 100))
                    .finish()
                    .expect("not evicted")
            })
            .collect();
        let mut silent: Vec<_> = (0..4)
            .map(|n| gate.start_probe(reserve(&gate, n + 120)))
            .collect();
        assert_eq!(gate.open(), 64);
        // Full: the newcomer takes the oldest silent connection's slot instead of a refusal.
        let newcomer = reserve(&gate, 200);
        assert!(silent[0].evicted.try_recv().is_ok());
        assert!(silent[1].evicted.try_recv().is_err());
        assert_eq!(gate.open(), 64);
        let newcomer = gate.start_probe(newcomer).finish().expect("not evicted");
        // Every slot held by a connection that qualified (or below the reserve): refused.
        drop(silent);
        let _more: Vec<_> = (0..3)
            .map(|n| gate.start_probe(reserve(&gate, n + 140)).finish())
            .collect();
        assert_eq!(gate.open(), 64);
        assert!(matches!(
            gate.admit(ip(201)),
            Admission::Refused(Refusal::Full)
        ));
        drop((passed, newcomer));
    }

    #[test]
    fn a_probe_in_its_grace_is_not_evicted() {
        let gate = Gate::new(Resolved {
            probe_grace: Duration::from_secs(3600),
            ..limits(64, 0, 16)
        });
        let _open: Vec<_> = (0..48).map(|n| gate.admit(ip(n + 1))).collect();
        // Past max_probing (4), young probes stay: the reserve holds more for a moment.
        let mut probes: Vec<_> = (0..16)
            .map(|n| gate.start_probe(reserve(&gate, n + 100)))
            .collect();
        for p in &mut probes {
            assert!(p.evicted.try_recv().is_err());
        }
        // Full, and every probe is young: the newcomer is refused, no one is evicted.
        assert_eq!(gate.open(), 64);
        assert!(matches!(
            gate.admit(ip(201)),
            Admission::Refused(Refusal::Full)
        ));
        assert!(probes[0].evicted.try_recv().is_err());
    }
}
