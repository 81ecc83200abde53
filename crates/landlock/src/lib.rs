//! The sandbox's Landlock ruleset: read and execute everywhere, full access beneath each
//! top-level directory except `/proc`, `/sys` and `/dev`, read-write on the device nodes
//! programs expect to write. Built inside the sandbox (paths are sandbox paths).
//!
//! Two users: the jail applies it to the agent before `execve` ([`restrict_self`]), and the
//! agent of a *restored* sandbox builds it ([`ruleset_fd`]) and applies it to every process
//! it spawns, because CRIU cannot restore a Landlock domain (see `docs/threat-model.md`).
//!
//! No scopes (abstract Unix sockets, signals): CRIU's parasite talks to CRIU over an abstract
//! Unix socket, which a scoped domain refuses (the dump fails and the sandbox dies). The
//! sandbox's private pid and network namespaces already keep signals and abstract sockets
//! inside it, which is what the scopes added.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus,
};

/// Device nodes (and their directories) writable under the ruleset.
pub const WRITABLE_DEVICES: [&str; 9] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
    "/dev/random",
    "/dev/urandom",
];

/// Top-level directories that get full access: every entry of `/` except the kernel
/// filesystems.
pub fn writable_roots(entries: impl IntoIterator<Item = String>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = entries
        .into_iter()
        .filter(|n| !matches!(n.as_str(), "proc" | "sys" | "dev"))
        .map(|n| Path::new("/").join(n))
        .collect();
    v.sort();
    v
}

fn err(what: &str, e: &dyn std::fmt::Display) -> String {
    format!("landlock {what}: {e}")
}

/// The ruleset, created and filled, not yet applied. Best effort: a kernel without Landlock
/// yields a ruleset that restricts nothing.
pub fn ruleset() -> Result<RulesetCreated, String> {
    let abi = ABI::V6;
    let all = AccessFs::from_all(abi);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(|e| err("handle_access", &e))?
        .create()
        .map_err(|e| err("create", &e))?;
    let root = PathFd::new("/").map_err(|e| err("open /", &e))?;
    ruleset = ruleset
        .add_rule(PathBeneath::new(root, AccessFs::from_read(abi)))
        .map_err(|e| err("rule /", &e))?;
    let names = fs::read_dir("/")
        .map_err(|e| err("read /", &e))?
        .filter_map(Result::ok)
        // metadata() follows symlinks, so merged-/usr links like /bin count as directories.
        .filter(|e| fs::metadata(e.path()).is_ok_and(|m| m.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned());
    for dir in writable_roots(names) {
        let fd = PathFd::new(&dir).map_err(|e| err(&format!("open {}", dir.display()), &e))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, all))
            .map_err(|e| err(&format!("rule {}", dir.display()), &e))?;
    }
    for dev in WRITABLE_DEVICES {
        let Ok(fd) = PathFd::new(dev) else { continue };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, all))
            .map_err(|e| err(&format!("rule {dev}"), &e))?;
    }
    Ok(ruleset)
}

/// Apply the ruleset to the calling thread (and what it then executes). Does not set
/// `no_new_privs`: the caller holds CAP_SYS_ADMIN in its user namespace instead (the jail's
/// init, before it drops its capabilities), so set-uid programs keep working in the sandbox.
pub fn restrict_self() -> Result<RulesetStatus, String> {
    let status = ruleset()?
        .no_new_privs(false)
        .restrict_self()
        .map_err(|e| err("restrict_self", &e))?;
    Ok(status.ruleset)
}

/// The ruleset as a file descriptor for `landlock_restrict_self(2)`, which a forked child can
/// call before `execve` (async-signal-safe, unlike building the ruleset). None when the kernel
/// has no Landlock.
pub fn ruleset_fd() -> Result<Option<OwnedFd>, String> {
    Ok(ruleset()?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_roots_skip_kernel_filesystems() {
        let names = ["usr", "proc", "etc", "dev", "sys", "home", "app"].map(String::from);
        assert_eq!(
            writable_roots(names),
            ["/app", "/etc", "/home", "/usr"]
                .map(PathBuf::from)
                .to_vec()
        );
    }
}
