//! How big each template's warm pool should be, and when the filler may grow or shrink it.
//! Pure functions of the observed demand and the clock, so the policy is tested without a
//! driver; the filler (`filler.rs`) only applies them. Leaf module.
//!
//! Demand is the number of creates of a template within the last [`DEMAND_WINDOW`], or the
//! highest such count seen recently, decayed by half every [`DEMAND_HALF_LIFE`]: a burst of
//! 100 grows the pool toward 100 (plus headroom, within the operator's max) so the next burst
//! finds it warm, and an idle template shrinks back to its min over a few minutes.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Creates counted as current demand.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);
/// The remembered peak halves over this long without a higher one.
pub const DEMAND_HALF_LIFE: Duration = Duration::from_secs(60);
/// Members kept per unit of demand (room for the next burst being a bit larger).
pub const HEADROOM: f64 = 1.25;
/// Creates in flight (admitted, queued or running) from which a refill waits (any: a refill
/// running beside a create's `/init` competes for the CPU and shows in its latency)...
pub const REFILL_DEFER_AT: usize = 1;
/// ...but never longer than this per member, so a pool under sustained load still refills.
pub const MAX_REFILL_DEFER: Duration = Duration::from_secs(1);
/// At most one surplus member per template is stopped per this interval (stopping costs CPU
/// too, and demand may come back).
pub const SHRINK_INTERVAL: Duration = Duration::from_secs(1);

/// An operator's bounds for one template's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    pub min: usize,
    pub max: usize,
}

impl PoolLimits {
    /// A pool that does not adapt (`--pool-size N`).
    pub fn fixed(n: usize) -> Self {
        Self { min: n, max: n }
    }
}

/// Pool bounds per template: explicit ones (`--pool NAME=MIN..MAX`), else the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub per_template: HashMap<String, PoolLimits>,
    /// For templates without an entry.
    pub default: PoolLimits,
}

impl PoolConfig {
    /// The same fixed size for every template (the behaviour of `--pool-size`).
    pub fn fixed(n: usize) -> Self {
        Self {
            per_template: HashMap::new(),
            default: PoolLimits::fixed(n),
        }
    }

    pub fn limits(&self, template: &str) -> PoolLimits {
        self.per_template
            .get(template)
            .copied()
            .unwrap_or(self.default)
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self::fixed(2)
    }
}

/// Creates of one template over time.
#[derive(Debug, Default)]
pub struct Demand {
    /// Creates within the last [`DEMAND_WINDOW`].
    recent: VecDeque<Instant>,
    /// The highest window count seen, and when.
    peak: Option<(usize, Instant)>,
}

impl Demand {
    /// One create of this template (a pool hit or a cold start alike).
    pub fn record(&mut self, now: Instant) {
        self.expire(now);
        self.recent.push_back(now);
        let n = self.recent.len();
        if n as f64 >= self.decayed_peak(now) {
            self.peak = Some((n, now));
        }
    }

    /// Current demand: the window count or the decayed peak, whichever is higher.
    pub fn level(&mut self, now: Instant) -> f64 {
        self.expire(now);
        (self.recent.len() as f64).max(self.decayed_peak(now))
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&t) = self.recent.front() {
            if now.saturating_duration_since(t) < DEMAND_WINDOW {
                break;
            }
            self.recent.pop_front();
        }
    }

    fn decayed_peak(&self, now: Instant) -> f64 {
        self.peak.map_or(0.0, |(n, at)| {
            let halvings =
                now.saturating_duration_since(at).as_secs_f64() / DEMAND_HALF_LIFE.as_secs_f64();
            n as f64 * 0.5f64.powf(halvings)
        })
    }
}

/// How many members the pool should hold for `demand`, within the operator's bounds.
pub fn target_size(limits: PoolLimits, demand: f64) -> usize {
    let want = (demand * HEADROOM).ceil() as usize;
    want.clamp(limits.min, limits.max.max(limits.min))
}

/// Whether a refill start may run now, with `in_flight` creates admitted and `deferred` spent
/// waiting for them already: refills yield to a burst of creates (they would compete for the
/// same CPU), up to [`MAX_REFILL_DEFER`].
pub fn refill_may_start(in_flight: usize, deferred: Duration) -> bool {
    in_flight < REFILL_DEFER_AT || deferred >= MAX_REFILL_DEFER
}

/// Whether one surplus member should be stopped now.
pub fn should_shrink(have: usize, target: usize, since_last_shrink: Option<Duration>) -> bool {
    have > target && since_last_shrink.is_none_or(|d| d >= SHRINK_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: PoolLimits = PoolLimits { min: 2, max: 128 };

    #[test]
    fn an_idle_template_keeps_its_minimum() {
        let mut d = Demand::default();
        assert_eq!(target_size(B, d.level(Instant::now())), 2);
    }

    #[test]
    fn a_burst_grows_the_pool_toward_it_within_the_max() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        for _ in 0..40 {
            d.record(t0);
        }
        assert_eq!(target_size(B, d.level(t0)), 50);
        for _ in 0..200 {
            d.record(t0);
        }
        assert_eq!(target_size(B, d.level(t0)), 128, "clamped to the max");
    }

    #[test]
    fn demand_decays_after_the_window_and_the_pool_shrinks_to_its_minimum() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        for _ in 0..80 {
            d.record(t0);
        }
        // Past the window the peak still counts, halved per half-life.
        let later = t0 + DEMAND_HALF_LIFE;
        assert_eq!(target_size(B, d.level(later)), 50);
        let much_later = t0 + DEMAND_HALF_LIFE * 10;
        assert_eq!(target_size(B, d.level(much_later)), 2);
    }

    #[test]
    fn a_steady_rate_is_counted_over_the_window() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        // 5 creates a second for 20 s: 50 in any 10 s window.
        for i in 0..100 {
            d.record(t0 + Duration::from_millis(200 * i));
        }
        let end = t0 + Duration::from_millis(200 * 99);
        let level = d.level(end);
        assert!((49.0..=51.0).contains(&level), "{level}");
    }

    #[test]
    fn a_fixed_pool_never_adapts() {
        let mut d = Demand::default();
        let t0 = Instant::now();
        for _ in 0..100 {
            d.record(t0);
        }
        assert_eq!(target_size(PoolLimits::fixed(3), d.level(t0)), 3);
        assert_eq!(target_size(PoolLimits::fixed(0), d.level(t0)), 0);
    }

    #[test]
    fn refills_yield_to_a_burst_but_not_forever() {
        assert!(refill_may_start(0, Duration::ZERO));
        assert!(!refill_may_start(1, Duration::ZERO));
        assert!(!refill_may_start(50, Duration::from_millis(100)));
        assert!(refill_may_start(50, MAX_REFILL_DEFER));
    }

    #[test]
    fn shrinking_is_paced() {
        assert!(!should_shrink(2, 2, None));
        assert!(should_shrink(3, 2, None));
        assert!(!should_shrink(30, 2, Some(Duration::from_millis(10))));
        assert!(should_shrink(30, 2, Some(SHRINK_INTERVAL)));
    }

    #[test]
    fn per_template_bounds_override_the_default() {
        let mut c = PoolConfig::fixed(2);
        c.per_template.insert("base".into(), B);
        assert_eq!(c.limits("base"), B);
        assert_eq!(c.limits("code-interpreter-v1"), PoolLimits::fixed(2));
    }
}
