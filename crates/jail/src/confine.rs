//! Last steps before `execve`: Landlock and capabilities (no `no_new_privs`: see `child`). Run
//! in the launcher's child, after `pivot_root`, so paths are sandbox paths.

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

/// Landlock (the ruleset lives in `bulkhead-landlock`, shared with the agent, which re-applies
/// it to what it spawns after a restore).
pub fn apply_landlock() -> Result<landlock::RulesetStatus, String> {
    bulkhead_landlock::restrict_self().map_err(|e| e.to_string())
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
}
