//! Last steps before `execve`: capabilities, `no_new_privs`, Landlock. Run in the launcher's
//! child, after `pivot_root`, so paths are sandbox paths.

use std::fs;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus,
};

/// Docker's default capability set: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID,
/// SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP. Inside the user
/// namespace they act only on objects mapped into it; `useradd`/`su`-style tools need them.
pub const DOCKER_DEFAULT_CAPS: u64 = 0xa804_25fb;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn errno_msg(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Shrink the bounding set to `keep`, clear the ambient set, and set effective, permitted and
/// inheritable to `keep`.
pub fn limit_capabilities(keep: u64) -> Result<(), String> {
    for cap in 0..64u64 {
        // SAFETY: prctl with integer arguments.
        let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
        if present < 0 {
            break; // EINVAL: past the last capability this kernel knows
        }
        if present == 1 && keep & (1 << cap) == 0 {
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } < 0 {
                return Err(errno_msg(&format!(
                    "drop capability {cap} from the bounding set"
                )));
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    } < 0
    {
        return Err(errno_msg("clear ambient capabilities"));
    }
    let lo = keep as u32;
    let hi = (keep >> 32) as u32;
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: lo,
            permitted: lo,
            inheritable: lo,
        },
        CapData {
            effective: hi,
            permitted: hi,
            inheritable: hi,
        },
    ];
    // SAFETY: header and the two-element data array (v3 layout) are valid for the call.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) } < 0 {
        return Err(errno_msg("capset"));
    }
    Ok(())
}

pub fn set_no_new_privs() -> Result<(), String> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(errno_msg("PR_SET_NO_NEW_PRIVS"));
    }
    Ok(())
}

/// Top-level directories that get full access: everything under `/` except the kernel's
/// pseudo-filesystems (`/proc`, `/sys`) and `/dev` (only the device nodes below are writable).
pub fn writable_roots(entries: impl IntoIterator<Item = String>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = entries
        .into_iter()
        .filter(|n| !matches!(n.as_str(), "proc" | "sys" | "dev"))
        .map(|n| Path::new("/").join(n))
        .collect();
    v.sort();
    v
}

/// Device paths readable and writable inside the sandbox.
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

/// Best-effort Landlock: read+execute everywhere, full access beneath each top-level directory,
/// read-write on the device nodes. No Landlock scopes: CRIU's parasite (pause, snapshot, fork)
/// talks to CRIU over an abstract Unix socket, which a scoped domain refuses (the dump fails and
/// the sandbox dies). The private pid and network namespaces already keep signals and abstract
/// sockets inside the sandbox, which is what the scopes added.
pub fn apply_landlock() -> Result<RulesetStatus, String> {
    let abi = ABI::V6;
    let all = AccessFs::from_all(abi);
    let err = |what: &str, e: &dyn std::fmt::Display| format!("landlock {what}: {e}");
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
    let status = ruleset
        .restrict_self()
        .map_err(|e| err("restrict_self", &e))?;
    Ok(status.ruleset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_default_set_is_the_documented_list() {
        // CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE NET_RAW
        // SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP (numbers from <linux/capability.h>).
        let caps = [0u32, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31];
        let mask = caps.iter().fold(0u64, |m, c| m | (1u64 << c));
        assert_eq!(mask, DOCKER_DEFAULT_CAPS);
        const CAP_SYS_ADMIN: u32 = 21;
        assert_eq!(DOCKER_DEFAULT_CAPS & (1 << CAP_SYS_ADMIN), 0);
    }

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
