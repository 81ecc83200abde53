//! Measurements for `GET /metrics`: memory from `/proc/meminfo`, disk from `statvfs("/")`, and
//! CPU usage sampled between calls from `/proc/stat`.
//!
//! A leaf: the shared state owns a [`CpuSampler`], and the `/metrics` handler calls
//! [`collect`]; neither is imported back from here.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bulkhead_envd::rest::Metrics;

/// The figures `GET /metrics` reports, measured now.
pub async fn collect(cpu: &CpuSampler) -> Metrics {
    let cpu_used_pct = cpu.usage_percent().await;
    let mem = read_meminfo().unwrap_or_default();
    let (disk_total, disk_used) = disk_usage().unwrap_or_default();
    let cpu_count = std::thread::available_parallelism()
        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
    Metrics {
        ts: chrono::Utc::now().timestamp(),
        cpu_count,
        cpu_used_pct,
        mem_total: mem.total,
        mem_used: mem.used,
        mem_cache: mem.cache,
        mem_total_mib: mem.total >> 20,
        mem_used_mib: mem.used >> 20,
        disk_used,
        disk_total,
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct MemInfo {
    total: u64,
    used: u64,
    cache: u64,
}

fn parse_meminfo(text: &str) -> MemInfo {
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    let total = field("MemTotal");
    let cached = field("Cached") + field("SReclaimable");
    let used = total
        .saturating_sub(field("MemFree"))
        .saturating_sub(field("Buffers"))
        .saturating_sub(cached);
    MemInfo {
        total,
        used,
        cache: field("Cached"),
    }
}

fn read_meminfo() -> std::io::Result<MemInfo> {
    Ok(parse_meminfo(&std::fs::read_to_string("/proc/meminfo")?))
}

fn disk_usage() -> nix::Result<(u64, u64)> {
    let stat = nix::sys::statvfs::statvfs("/")?;
    let frsize = stat.fragment_size();
    let total = stat.blocks() * frsize;
    let used = (stat.blocks() - stat.blocks_free()) * frsize;
    Ok((total, used))
}

/// (busy, total) jiffies from the first line of `/proc/stat`.
fn parse_cpu_times(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user/nice).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn cpu_times() -> Option<(u64, u64)> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// CPU usage between consecutive `/metrics` calls (or over 100 ms for the first one).
#[derive(Default)]
pub struct CpuSampler {
    last: Mutex<Option<(Instant, u64, u64)>>,
}

impl CpuSampler {
    /// Usage in percent of all CPUs.
    pub async fn usage_percent(&self) -> f64 {
        let previous = *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (busy0, total0) = match previous {
            Some((at, busy, total)) if at.elapsed() >= Duration::from_millis(100) => (busy, total),
            _ => {
                let Some(first) = cpu_times() else { return 0.0 };
                tokio::time::sleep(Duration::from_millis(100)).await;
                first
            }
        };
        let Some((busy1, total1)) = cpu_times() else {
            return 0.0;
        };
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((Instant::now(), busy1, total1));
        let total = total1.saturating_sub(total0);
        if total == 0 {
            return 0.0;
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "jiffy counts are far below 2^52"
        )]
        let pct = busy1.saturating_sub(busy0) as f64 / total as f64 * 100.0;
        (pct * 100.0).round() / 100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_cpu_parsing() {
        let text = "MemTotal:       1000 kB\nMemFree:         100 kB\nBuffers:          50 kB\nCached:          200 kB\nSReclaimable:     50 kB\n";
        assert_eq!(
            parse_meminfo(text),
            MemInfo {
                total: 1_024_000,
                used: 600 * 1024,
                cache: 200 * 1024
            }
        );
        let stat = "cpu  10 0 10 70 10 0 0 0 0 0\ncpu0 1 2 3\n";
        assert_eq!(parse_cpu_times(stat), Some((20, 100)));
    }
}
