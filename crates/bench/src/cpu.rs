//! CPU per create for `bulkhead-bench`: system-wide busy time over a window (from /proc/stat)
//! and who spent it: the server process itself, the children it reaped (the jail launcher, and
//! every sandbox it killed), the sandboxes' cgroups, this bench client, and the rest (kernel
//! threads, and on a shared machine other people's work).
//!
//! The server is found by the process listening on the API port (or `--server-pid`); its
//! sandbox cgroup parent by the cgroup of one of its sandboxes (a child of the server, which is
//! their subreaper), whose CPU counter is hierarchical and keeps what removed children used.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Clock ticks per second of /proc's tick counters (USER_HZ; 100 on every Linux we support).
const TICKS_PER_SEC: f64 = 100.0;

/// One reading of every counter.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuSample {
    /// System-wide busy time (everything but idle and iowait), ms.
    system_ms: f64,
    /// The server's own user+system time, ms.
    server_ms: f64,
    /// CPU of the server's reaped children (cutime+cstime), ms.
    reaped_ms: f64,
    /// CPU of the server's live helper children (the launcher zygote and the request handlers
    /// it reaped), ms.
    helpers_ms: f64,
    /// The sandboxes' cgroup subtree, ms.
    sandboxes_ms: f64,
    /// This bench process, ms.
    client_ms: f64,
}

impl CpuSample {
    /// The server's and its children's counters (still while no sandbox work is going on).
    pub(crate) fn server_activity(&self) -> (u64, u64, u64) {
        (
            self.server_ms as u64,
            self.reaped_ms as u64,
            self.helpers_ms as u64,
        )
    }
}

/// Where the counters are read from.
pub(crate) struct CpuProbe {
    server_pid: i32,
    /// The CPU counter file of the server's sandbox cgroup parent, once found.
    sandbox_counter: Option<PathBuf>,
}

impl CpuProbe {
    /// The probe for the server `pid`, or the one listening on `host_port` (e.g.
    /// `127.0.0.1:3000`) when no pid is given.
    pub(crate) fn new(pid: Option<i32>, host_port: &str) -> anyhow::Result<CpuProbe> {
        let server_pid = match pid {
            Some(p) => p,
            None => {
                let port: u16 = host_port
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .context("the API URL has no port")?;
                listener_pid(port).with_context(|| {
                    format!(
                        "cannot find the server listening on port {port} (CPU figures need it \
                         on this machine): pass --server-pid"
                    )
                })?
            }
        };
        Ok(CpuProbe {
            server_pid,
            sandbox_counter: None,
        })
    }

    pub(crate) fn server_pid(&self) -> i32 {
        self.server_pid
    }

    /// Find the sandbox cgroup parent from a live sandbox of the server; call while one runs.
    pub(crate) fn find_sandbox_cgroup(&mut self) {
        if self.sandbox_counter.is_none() {
            self.sandbox_counter = children(self.server_pid)
                .into_iter()
                .find_map(|c| sandbox_parent_counter(c, self.server_pid));
        }
    }

    pub(crate) fn has_sandbox_cgroup(&self) -> bool {
        self.sandbox_counter.is_some()
    }

    pub(crate) fn sample(&self) -> anyhow::Result<CpuSample> {
        let (server, reaped) = proc_times(self.server_pid)
            .with_context(|| format!("read /proc/{}/stat", self.server_pid))?;
        let (client, _) = proc_times(std::process::id() as i32)?;
        let helpers = children(self.server_pid)
            .into_iter()
            .filter(|c| same_cgroup(*c, self.server_pid))
            .filter_map(|c| proc_times(c).ok())
            .map(|(own, reaped)| own + reaped)
            .sum();
        Ok(CpuSample {
            system_ms: system_busy_ms()?,
            server_ms: server,
            reaped_ms: reaped,
            helpers_ms: helpers,
            sandboxes_ms: self
                .sandbox_counter
                .as_deref()
                .and_then(cgroup_cpu_ms)
                .unwrap_or(0.0),
            client_ms: client,
        })
    }
}

/// CPU spent between two samples, per create.
pub(crate) struct CpuPerCreate {
    pub(crate) system: f64,
    pub(crate) server: f64,
    pub(crate) reaped: f64,
    pub(crate) live_helpers: f64,
    pub(crate) sandboxes: f64,
    pub(crate) client: f64,
}

impl CpuPerCreate {
    pub(crate) fn between(a: &CpuSample, b: &CpuSample, n: usize) -> CpuPerCreate {
        let n = n.max(1) as f64;
        CpuPerCreate {
            system: (b.system_ms - a.system_ms) / n,
            server: (b.server_ms - a.server_ms) / n,
            reaped: (b.reaped_ms - a.reaped_ms) / n,
            live_helpers: (b.helpers_ms - a.helpers_ms) / n,
            sandboxes: (b.sandboxes_ms - a.sandboxes_ms) / n,
            client: (b.client_ms - a.client_ms) / n,
        }
    }

    /// The launcher: the live zygote's (and its handlers') time, plus what the server's reaped
    /// children have beyond the sandboxes (killed sandboxes are reaped by the server, so their
    /// CPU shows in both `reaped` and `sandboxes`; executed launchers only in `reaped`). The
    /// second part is a lower bound: the sandbox cgroups also hold kernel work no reaped process
    /// is charged with.
    pub(crate) fn helpers(&self) -> f64 {
        self.live_helpers + (self.reaped - self.sandboxes).max(0.0)
    }

    /// What no process of ours accounts for: kernel threads, interrupts, other users.
    pub(crate) fn rest(&self) -> f64 {
        self.system - self.server - self.sandboxes - self.helpers() - self.client
    }

    pub(crate) fn rows(&self, label: &str) -> String {
        format!(
            "{label}: CPU per create {:.2} ms (system-wide busy)\n  \
             server {:.2} | launcher (zygote, or executed; ≥) {:.2} | sandboxes (cgroups) {:.2} | \
             bench client {:.2} | kernel threads & rest {:.2}\n  \
             (server's reaped children {:.2} ms = helpers + killed sandboxes)",
            self.system,
            self.server,
            self.helpers(),
            self.sandboxes,
            self.client,
            self.rest(),
            self.reaped,
        )
    }
}

fn system_busy_ms() -> anyhow::Result<f64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    anyhow::ensure!(v.len() >= 8, "unexpected /proc/stat: {line}");
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    Ok(busy as f64 * 1000.0 / TICKS_PER_SEC)
}

/// (utime+stime, cutime+cstime) of `pid`, in ms.
fn proc_times(pid: i32) -> anyhow::Result<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let f = after_comm(&stat).context("unexpected /proc/<pid>/stat")?;
    // Fields after the comm start at field 3 (state); utime is field 14.
    let num = |i: usize| -> f64 { f.get(i - 3).and_then(|x| x.parse().ok()).unwrap_or(0.0) };
    let to_ms = 1000.0 / TICKS_PER_SEC;
    Ok(((num(14) + num(15)) * to_ms, (num(16) + num(17)) * to_ms))
}

fn after_comm(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// Are `a` and `b` in the same cgroup (the unified or cpuacct line)?
fn same_cgroup(a: i32, b: i32) -> bool {
    let read = |p: i32| fs::read_to_string(format!("/proc/{p}/cgroup")).ok();
    matches!((read(a), read(b)), (Some(x), Some(y)) if x == y)
}

fn parent_pid(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    after_comm(&stat)?.get(1)?.parse().ok()
}

fn children(pid: i32) -> Vec<i32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| parent_pid(p) == Some(pid))
        .collect()
}

/// The CPU counter of the cgroup directly above `child`'s, if `child` is in a different cgroup
/// than the server (i.e. it is a sandbox).
fn sandbox_parent_counter(child: i32, server: i32) -> Option<PathBuf> {
    let mine = fs::read_to_string(format!("/proc/{child}/cgroup")).ok()?;
    let servers = fs::read_to_string(format!("/proc/{server}/cgroup")).ok()?;
    let find = |text: &str, v1: bool| -> Option<String> {
        text.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctl, path) = (it.next()?, it.next()?, it.next()?);
            let hit = if v1 {
                ctl.split(',').any(|c| c == "cpuacct")
            } else {
                ctl.is_empty()
            };
            hit.then(|| path.to_string())
        })
    };
    for v1 in [true, false] {
        let (Some(p), Some(s)) = (find(&mine, v1), find(&servers, v1)) else {
            continue;
        };
        if p == s {
            return None;
        }
        let parent = Path::new(&p).parent()?;
        let rel = parent.strip_prefix("/").unwrap_or(parent);
        let counter = if v1 {
            cpuacct_mount()?.join(rel).join("cpuacct.usage")
        } else {
            Path::new("/sys/fs/cgroup").join(rel).join("cpu.stat")
        };
        return counter.exists().then_some(counter);
    }
    None
}

fn cpuacct_mount() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpuacct"))
            .then(|| PathBuf::from(f[1]))
    })
}

fn cgroup_cpu_ms(counter: &Path) -> Option<f64> {
    let text = fs::read_to_string(counter).ok()?;
    if counter.ends_with("cpuacct.usage") {
        return Some(text.trim().parse::<f64>().ok()? / 1e6);
    }
    let us = bulkhead_jail::cgroup::stat_field(&text, "usage_usec")?;
    Some(us as f64 / 1e3)
}

/// The pid holding the listening TCP socket on `port`.
fn listener_pid(port: u16) -> Option<i32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT; state 0A is LISTEN; inode is field 10.
            let listening = f.get(3) == Some(&"0A");
            let on_port = f
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                == Some(port);
            if listening && on_port {
                inodes.extend(f.get(9).map(|i| format!("socket:[{i}]")));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    fs::read_link(fd.path())
                        .is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
                })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_times_and_the_system_is_busy_sometimes() {
        let (own, _) = proc_times(std::process::id() as i32).unwrap();
        assert!(own >= 0.0);
        assert!(system_busy_ms().unwrap() > 0.0);
    }

    #[test]
    fn a_listener_is_found_by_its_port() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(listener_pid(port), Some(std::process::id() as i32));
    }

    #[test]
    fn helpers_and_rest_are_what_is_left() {
        let a = CpuSample::default();
        let b = CpuSample {
            system_ms: 100.0,
            server_ms: 20.0,
            reaped_ms: 50.0,
            helpers_ms: 5.0,
            sandboxes_ms: 30.0,
            client_ms: 10.0,
        };
        let c = CpuPerCreate::between(&a, &b, 10);
        assert_eq!(c.helpers(), 2.5);
        assert_eq!(c.rest(), 10.0 - 2.0 - 3.0 - 2.5 - 1.0);
    }
}
