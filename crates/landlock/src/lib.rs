//! The sandbox's Landlock ruleset: every filesystem right beneath `/` except device ioctls,
//! which only the terminal and null-style devices programs use allow. Built inside the sandbox
//! (paths are sandbox paths).
//!
//! Why so little: E2B lets a sandbox create entries directly under `/` (`files.write("/0/x")`,
//! `sudo mkdir /app`), and Landlock grants a right on a directory to everything beneath it, so
//! a rule that allows new top-level directories also allows `/proc`, `/dev` and `/sys`. Their
//! protection is therefore the mounts' (read-only `/proc`, `/dev` and `/sys`, see the jail's
//! `mountplan`), which refuse writes to every process, restored ones included, where Landlock
//! protected only processes started in a fresh sandbox (`docs/threat-model.md`).
//!
//! The jail applies it to the agent before `execve` ([`restrict_self`]). CRIU cannot restore a
//! Landlock domain, and a restored sandbox does not get it back: re-applying it would need
//! `no_new_privs`, which breaks `sudo`, for a ruleset that only limits device ioctls
//! (`docs/persistence.md`).
//!
//! No scopes (abstract Unix sockets, signals): CRIU's parasite talks to CRIU over an abstract
//! Unix socket, which a scoped domain refuses (the dump fails and the sandbox dies). The
//! sandbox's private pid and network namespaces already keep signals and abstract sockets
//! inside it, which is what the scopes added.

use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus,
};

/// Device nodes (and their directories) that allow ioctls under the ruleset.
pub const IOCTL_DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/random",
    "/dev/urandom",
];

/// The ABI the ruleset is written for; older kernels enforce what they know (best effort).
const ABI_VERSION: ABI = ABI::V6;

/// The rules as data: a path and the rights granted beneath it.
pub fn rules() -> Vec<(&'static Path, BitFlags<AccessFs>)> {
    let all = AccessFs::from_all(ABI_VERSION);
    let mut v = vec![(Path::new("/"), all & !AccessFs::IoctlDev)];
    v.extend(IOCTL_DEVICES.iter().map(|d| (Path::new(*d), all)));
    v
}

/// Why the ruleset could not be built or applied; each names the step.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock {what}: {source}")]
    Ruleset {
        what: String,
        #[source]
        source: landlock::RulesetError,
    },
    #[error("landlock open /: cannot open the root directory")]
    NoRoot,
}

fn err(what: impl Into<String>) -> impl FnOnce(landlock::RulesetError) -> LandlockError {
    let what = what.into();
    move |source| LandlockError::Ruleset { what, source }
}

/// The ruleset, created and filled, not yet applied. Best effort: a kernel without Landlock
/// yields a ruleset that restricts nothing.
pub fn ruleset() -> Result<RulesetCreated, LandlockError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI_VERSION))
        .map_err(err("handle_access"))?
        .create()
        .map_err(err("create"))?;
    for (path, access) in rules() {
        // A device this sandbox lacks needs no rule.
        let Ok(fd) = PathFd::new(path) else {
            if path == Path::new("/") {
                return Err(LandlockError::NoRoot);
            }
            continue;
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(err(format!("rule {}", path.display())))?;
    }
    Ok(ruleset)
}

/// Apply the ruleset to the calling thread (and what it then executes). Does not set
/// `no_new_privs`: the caller holds CAP_SYS_ADMIN in its user namespace instead (the jail's
/// init, before it drops its capabilities), so set-uid programs keep working in the sandbox.
pub fn restrict_self() -> Result<RulesetStatus, LandlockError> {
    let status = ruleset()?
        .no_new_privs(false)
        .restrict_self()
        .map_err(err("restrict_self"))?;
    Ok(status.ruleset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_beneath_root_but_device_ioctls() {
        let rules = rules();
        let all = AccessFs::from_all(ABI_VERSION);
        let (root, access) = rules[0];
        assert_eq!(root, Path::new("/"));
        // New top-level entries need these beneath `/` (E2B's `/0/x.txt`).
        for right in [
            AccessFs::MakeDir,
            AccessFs::MakeReg,
            AccessFs::WriteFile,
            AccessFs::Truncate,
            AccessFs::RemoveDir,
            AccessFs::Refer,
        ] {
            assert!(access.contains(right), "{right:?} beneath /");
        }
        assert!(!access.contains(AccessFs::IoctlDev));
        assert!(rules[1..].iter().all(|(_, a)| *a == all));
        let devices: Vec<_> = rules[1..].iter().map(|(p, _)| *p).collect();
        assert!(devices.contains(&Path::new("/dev/pts")));
        assert!(devices.iter().all(|p| p.starts_with("/dev")));
    }
}
