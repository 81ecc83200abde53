//! Per-sandbox cgroups behind one trait with a v1 (one hierarchy per controller, as on hybrid
//! hosts) and a v2 (unified) implementation. Both work on configurable root paths, so the
//! path and limit logic is tested against a temporary directory.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::freezer::Freezer;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

impl std::fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// A cgroup's limits (see [`CgroupLimits::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory and memory+swap limit (swap is not granted on top).
    pub memory_bytes: u64,
    pub pids_max: u64,
    pub cpu_period_us: u64,
    /// `None`: no CPU limit.
    pub cpu_quota_us: Option<u64>,
}

pub const CPU_PERIOD_US: u64 = 100_000;

impl CgroupLimits {
    /// The limits of a sandbox with `memory_mb` of memory, `pids_max` tasks and `cpus` CPUs'
    /// worth of quota (0: no CPU limit). A zero memory or task limit counts as 1.
    pub fn new(memory_mb: u64, pids_max: u64, cpus: u32) -> CgroupLimits {
        CgroupLimits {
            memory_bytes: memory_mb.max(1).saturating_mul(1024 * 1024),
            pids_max: pids_max.max(1),
            cpu_period_us: CPU_PERIOD_US,
            cpu_quota_us: (cpus > 0).then(|| u64::from(cpus).saturating_mul(CPU_PERIOD_US)),
        }
    }
}

/// Raw counters read from a sandbox cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub cpu_usage_ns: u64,
    /// Charged memory minus inactive page cache (what `docker stats` calls usage).
    pub mem_used_bytes: u64,
    pub mem_cache_bytes: u64,
    pub mem_limit_bytes: u64,
    pub pids_current: u64,
}

pub trait CgroupBackend: Send + Sync + std::fmt::Debug {
    fn version(&self) -> CgroupVersion;
    /// Create the sandbox's cgroup(s) with limits; returns the `cgroup.procs` files to write
    /// the sandbox init into.
    fn create(&self, name: &str, limits: &CgroupLimits) -> io::Result<Vec<PathBuf>>;
    /// Every directory that makes up the sandbox's cgroup.
    fn dirs(&self, name: &str) -> Vec<PathBuf>;
    /// Pids currently in the sandbox's cgroup.
    fn pids(&self, name: &str) -> io::Result<Vec<i32>>;
    /// SIGKILL everything in the cgroup.
    fn kill_all(&self, name: &str) -> io::Result<()>;
    /// Remove the cgroup directories; missing ones are fine, busy ones are an error.
    fn remove(&self, name: &str) -> io::Result<()>;
    fn usage(&self, name: &str) -> io::Result<CgroupUsage>;
    /// Background (the smallest CPU weight: runs when nothing else wants the CPU) or normal
    /// CPU weight relative to the other sandboxes.
    fn set_background(&self, name: &str, background: bool) -> io::Result<()>;
    /// Names of existing sandbox cgroups under the parent (for cleaning up after a crash).
    fn list(&self) -> io::Result<Vec<String>>;
    /// The parent directories themselves (removed when the server stops with none left).
    fn parent_dirs(&self) -> Vec<PathBuf>;
    /// The freezer of the sandbox's cgroup; None when the host has no freezer hierarchy.
    fn freezer(&self, name: &str) -> Option<Freezer>;
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("write {value:?} to {}: {e}", path.display()),
        )
    })
}

fn read_u64(path: &Path) -> io::Result<u64> {
    let s = fs::read_to_string(path)?;
    let s = s.trim();
    if s == "max" {
        return Ok(u64::MAX);
    }
    s.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {s:?}", path.display()),
        )
    })
}

/// `key value` lines (memory.stat, cpu.stat).
pub fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_pids(procs: &Path) -> io::Result<Vec<i32>> {
    match fs::read_to_string(procs) {
        Ok(s) => Ok(s.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn kill_pids(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: kill has no memory-safety preconditions; ESRCH for an exited pid is fine.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn rmdir_if_exists(dir: &Path) -> io::Result<()> {
    match fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn list_children(dir: &Path) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in rd {
        let e = e?;
        if e.file_type()?.is_dir() {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Controllers the jail uses on v1, each in its own (or a shared) hierarchy.
pub const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// cgroup v1: `<mount of controller>/<parent>/<name>` in each hierarchy.
#[derive(Debug, Clone)]
pub struct V1 {
    /// Controller name -> hierarchy mount point (co-mounted controllers share one).
    pub mounts: BTreeMap<String, PathBuf>,
    pub parent: String,
}

impl V1 {
    fn dir(&self, controller: &str, name: &str) -> Option<PathBuf> {
        Some(self.mounts.get(controller)?.join(&self.parent).join(name))
    }

    /// One directory per distinct hierarchy (cpu,cpuacct co-mounted means one dir).
    fn unique_dirs(&self, name: &str) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = Vec::new();
        for c in V1_CONTROLLERS {
            if let Some(d) = self.dir(c, name)
                && !v.contains(&d)
            {
                v.push(d);
            }
        }
        v
    }

    fn ensure_parent(&self) -> io::Result<()> {
        for c in V1_CONTROLLERS {
            if let Some(m) = self.mounts.get(c) {
                fs::create_dir_all(m.join(&self.parent))?;
            }
        }
        Ok(())
    }

    fn pids_dir(&self, name: &str) -> io::Result<PathBuf> {
        self.dir("pids", name)
            .or_else(|| self.dir("memory", name))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no pids or memory hierarchy"))
    }
}

impl CgroupBackend for V1 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn create(&self, name: &str, limits: &CgroupLimits) -> io::Result<Vec<PathBuf>> {
        for required in ["memory", "pids", "cpu"] {
            if !self.mounts.contains_key(required) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("cgroup v1 controller {required} is not mounted"),
                ));
            }
        }
        let dirs = self.unique_dirs(name);
        for d in &dirs {
            // The parents exist after the first create; make them only when missing, not
            // with five `create_dir_all`s on every create.
            let made = match fs::create_dir(d) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.ensure_parent()?;
                    fs::create_dir(d)
                }
                other => other,
            };
            made.map_err(|e| io::Error::new(e.kind(), format!("mkdir {}: {e}", d.display())))?;
        }
        let mem = self.dir("memory", name).expect("checked above");
        let bytes = limits.memory_bytes.to_string();
        write(&mem.join("memory.limit_in_bytes"), &bytes)?;
        // memsw exists only with swap accounting; it must be >= the memory limit, which is set
        // first.
        let memsw = mem.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &bytes)?;
        }
        let pids = self.dir("pids", name).expect("checked above");
        write(&pids.join("pids.max"), &limits.pids_max.to_string())?;
        let cpu = self.dir("cpu", name).expect("checked above");
        write(
            &cpu.join("cpu.cfs_period_us"),
            &limits.cpu_period_us.to_string(),
        )?;
        if let Some(q) = limits.cpu_quota_us {
            write(&cpu.join("cpu.cfs_quota_us"), &q.to_string())?;
        }
        Ok(dirs.iter().map(|d| d.join("cgroup.procs")).collect())
    }

    fn dirs(&self, name: &str) -> Vec<PathBuf> {
        self.unique_dirs(name)
    }

    fn pids(&self, name: &str) -> io::Result<Vec<i32>> {
        read_pids(&self.pids_dir(name)?.join("cgroup.procs"))
    }

    fn kill_all(&self, name: &str) -> io::Result<()> {
        // v1 has no cgroup.kill. The pid namespace dies with its init anyway; this catches
        // anything that raced a fork. A few passes, since a task may fork between read and kill.
        for _ in 0..8 {
            let pids = self.pids(name)?;
            if pids.is_empty() {
                break;
            }
            kill_pids(&pids);
        }
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut first_err = None;
        for d in self.unique_dirs(name) {
            if let Err(e) = rmdir_if_exists(&d) {
                first_err.get_or_insert(io::Error::new(
                    e.kind(),
                    format!("rmdir {}: {e}", d.display()),
                ));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn usage(&self, name: &str) -> io::Result<CgroupUsage> {
        let mem = self.dir("memory", name).unwrap_or_default();
        let stat = fs::read_to_string(mem.join("memory.stat")).unwrap_or_default();
        let usage = read_u64(&mem.join("memory.usage_in_bytes"))?;
        let inactive = stat_field(&stat, "total_inactive_file")
            .or_else(|| stat_field(&stat, "inactive_file"))
            .unwrap_or(0);
        Ok(CgroupUsage {
            cpu_usage_ns: self
                .dir("cpuacct", name)
                .map(|d| read_u64(&d.join("cpuacct.usage")))
                .transpose()?
                .unwrap_or(0),
            mem_used_bytes: usage.saturating_sub(inactive),
            mem_cache_bytes: stat_field(&stat, "total_cache")
                .or_else(|| stat_field(&stat, "cache"))
                .unwrap_or(0),
            mem_limit_bytes: read_u64(&mem.join("memory.limit_in_bytes"))?,
            pids_current: self
                .dir("pids", name)
                .map(|d| read_u64(&d.join("pids.current")))
                .transpose()?
                .unwrap_or(0),
        })
    }

    fn parent_dirs(&self) -> Vec<PathBuf> {
        self.mounts.values().map(|m| m.join(&self.parent)).collect()
    }

    fn set_background(&self, name: &str, background: bool) -> io::Result<()> {
        let cpu = self
            .dir("cpu", name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cpu hierarchy"))?;
        // 2 is the smallest weight cpu.shares takes; 1024 the default.
        write(
            &cpu.join("cpu.shares"),
            if background { "2" } else { "1024" },
        )
    }

    fn freezer(&self, name: &str) -> Option<Freezer> {
        let state = self.dir("freezer", name)?.join("freezer.state");
        Some(Freezer::V1 { state })
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut all = Vec::new();
        for d in self.mounts.values() {
            for n in list_children(&d.join(&self.parent))? {
                if !all.contains(&n) {
                    all.push(n);
                }
            }
        }
        all.sort();
        Ok(all)
    }
}

/// cgroup v2: `<root>/<parent>/<name>`, controllers enabled down the path.
#[derive(Debug, Clone)]
pub struct V2 {
    pub root: PathBuf,
    pub parent: String,
}

pub const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

impl V2 {
    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(&self.parent).join(name)
    }

    /// Enable our controllers in every cgroup from the root down to the parent, so the
    /// sandbox cgroups get them.
    fn ensure_parent(&self) -> io::Result<()> {
        let parent = self.root.join(&self.parent);
        fs::create_dir_all(&parent)?;
        let mut dir = self.root.clone();
        let mut chain = vec![dir.clone()];
        for comp in Path::new(&self.parent).components() {
            dir.push(comp);
            chain.push(dir.clone());
        }
        for d in chain {
            let ctl = d.join("cgroup.subtree_control");
            let current = fs::read_to_string(&ctl).unwrap_or_default();
            for c in V2_CONTROLLERS {
                if !current.split_whitespace().any(|x| x == c) {
                    write(&ctl, &format!("+{c}"))?;
                }
            }
        }
        Ok(())
    }
}

impl CgroupBackend for V2 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn create(&self, name: &str, limits: &CgroupLimits) -> io::Result<Vec<PathBuf>> {
        self.ensure_parent()?;
        let d = self.dir(name);
        fs::create_dir(&d)
            .map_err(|e| io::Error::new(e.kind(), format!("mkdir {}: {e}", d.display())))?;
        write(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
        // memory.max does not include swap: forbid swap so memory+swap equals the limit.
        let swap = d.join("memory.swap.max");
        if swap.exists() {
            write(&swap, "0")?;
        }
        write(&d.join("pids.max"), &limits.pids_max.to_string())?;
        let quota = limits
            .cpu_quota_us
            .map_or("max".to_string(), |q| q.to_string());
        write(
            &d.join("cpu.max"),
            &format!("{quota} {}", limits.cpu_period_us),
        )?;
        Ok(vec![d.join("cgroup.procs")])
    }

    fn dirs(&self, name: &str) -> Vec<PathBuf> {
        vec![self.dir(name)]
    }

    fn pids(&self, name: &str) -> io::Result<Vec<i32>> {
        read_pids(&self.dir(name).join("cgroup.procs"))
    }

    fn kill_all(&self, name: &str) -> io::Result<()> {
        let d = self.dir(name);
        if !d.exists() {
            return Ok(());
        }
        let kill = d.join("cgroup.kill");
        if kill.exists() {
            return write(&kill, "1");
        }
        // Kernels before 5.14 have no cgroup.kill.
        for _ in 0..8 {
            let pids = self.pids(name)?;
            if pids.is_empty() {
                break;
            }
            kill_pids(&pids);
        }
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let d = self.dir(name);
        rmdir_if_exists(&d)
            .map_err(|e| io::Error::new(e.kind(), format!("rmdir {}: {e}", d.display())))
    }

    fn usage(&self, name: &str) -> io::Result<CgroupUsage> {
        let d = self.dir(name);
        let stat = fs::read_to_string(d.join("memory.stat")).unwrap_or_default();
        let cpu = fs::read_to_string(d.join("cpu.stat")).unwrap_or_default();
        let current = read_u64(&d.join("memory.current"))?;
        Ok(CgroupUsage {
            cpu_usage_ns: stat_field(&cpu, "usage_usec")
                .unwrap_or(0)
                .saturating_mul(1000),
            mem_used_bytes: current.saturating_sub(stat_field(&stat, "inactive_file").unwrap_or(0)),
            mem_cache_bytes: stat_field(&stat, "file").unwrap_or(0),
            mem_limit_bytes: read_u64(&d.join("memory.max"))?,
            pids_current: read_u64(&d.join("pids.current"))?,
        })
    }

    fn list(&self) -> io::Result<Vec<String>> {
        list_children(&self.root.join(&self.parent))
    }

    fn parent_dirs(&self) -> Vec<PathBuf> {
        vec![self.root.join(&self.parent)]
    }

    fn set_background(&self, name: &str, background: bool) -> io::Result<()> {
        // 1 is the smallest cpu.weight; 100 the default.
        write(
            &self.dir(name).join("cpu.weight"),
            if background { "1" } else { "100" },
        )
    }

    fn freezer(&self, name: &str) -> Option<Freezer> {
        // Every non-root cgroup has these since Linux 5.2; the jail needs 5.3 (pidfd_open).
        let d = self.dir(name);
        Some(Freezer::V2 {
            freeze: d.join("cgroup.freeze"),
            events: d.join("cgroup.events"),
        })
    }
}

/// Remove a sandbox cgroup, killing stragglers while tasks drain (rmdir fails with EBUSY until
/// the last task has exited).
pub fn remove_with_retry(be: &dyn CgroupBackend, name: &str, budget: Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + budget;
    loop {
        match be.remove(name) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => {
                let _ = be.kill_all(name);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// A cgroup mount from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    pub v2: bool,
    /// v1: the controllers (and `name=` entries) in the super options.
    pub options: Vec<String>,
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 {
            continue;
        }
        let v2 = match post[0] {
            "cgroup" => false,
            "cgroup2" => true,
            _ => continue,
        };
        out.push(CgroupMount {
            mount_point: PathBuf::from(unescape(pre[4])),
            v2,
            options: post[2].split(',').map(str::to_owned).collect(),
        });
    }
    out
}

/// Pick the backend for this host: v1 when the memory controller sits in a v1 hierarchy
/// (legacy and hybrid layouts), else v2 when the unified hierarchy offers memory.
/// `controllers_of` reads `cgroup.controllers` of a v2 mount (a parameter for tests).
pub fn detect_from(
    mounts: &[CgroupMount],
    parent: &str,
    controllers_of: impl Fn(&Path) -> String,
) -> Result<Box<dyn CgroupBackend>, DetectError> {
    let mut v1 = BTreeMap::new();
    for m in mounts.iter().filter(|m| !m.v2) {
        for c in V1_CONTROLLERS {
            if m.options.iter().any(|o| o == c) {
                v1.entry(c.to_string())
                    .or_insert_with(|| m.mount_point.clone());
            }
        }
    }
    if v1.contains_key("memory") {
        return Ok(Box::new(V1 {
            mounts: v1,
            parent: parent.to_string(),
        }));
    }
    for m in mounts.iter().filter(|m| m.v2) {
        let ctl = controllers_of(&m.mount_point);
        let have = |c: &str| ctl.split_whitespace().any(|x| x == c);
        if V2_CONTROLLERS.iter().all(|c| have(c)) {
            return Ok(Box::new(V2 {
                root: m.mount_point.clone(),
                parent: parent.to_string(),
            }));
        }
    }
    Err(DetectError::NoHierarchy {
        mounts: mounts.len(),
    })
}

/// Why no cgroup hierarchy can hold sandboxes.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("cannot read /proc/self/mountinfo: {0}")]
    Mountinfo(std::io::Error),
    #[error(
        "no usable cgroup hierarchy: need the memory, pids and cpu controllers in v1 hierarchies \
         or in the unified (v2) hierarchy; found {mounts} cgroup mount(s)"
    )]
    NoHierarchy { mounts: usize },
}

pub fn detect(parent: &str) -> Result<Box<dyn CgroupBackend>, DetectError> {
    let text = fs::read_to_string("/proc/self/mountinfo").map_err(DetectError::Mountinfo)?;
    detect_from(&parse_mountinfo(&text), parent, |p| {
        fs::read_to_string(p.join("cgroup.controllers")).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests;
