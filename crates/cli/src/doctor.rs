//! `bulkhead doctor`: which drivers this host can run, and why not. The facts are gathered
//! from the host ([`Facts::gather`]); the verdicts are pure functions of them, so they are
//! unit-tested without the host.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bulkhead_microvm::Accel;
use bulkhead_microvm::probe::AccelReport;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The microvm driver's guest kernel to check (as `serve --guest-kernel`).
    #[arg(long, env = "BULKHEAD_GUEST_KERNEL")]
    pub guest_kernel: Option<PathBuf>,
}

/// What the verdicts depend on.
#[derive(Debug, Clone)]
pub struct Facts {
    pub root: bool,
    pub overlay: bool,
    pub tun: bool,
    pub qemu: Option<PathBuf>,
    pub accel: AccelReport,
    pub mkfs_erofs: bool,
    pub mkfs_ext4: bool,
    /// `None`: not given; `Some((path, exists))`.
    pub guest_kernel: Option<(PathBuf, bool)>,
}

impl Facts {
    pub fn gather(guest_kernel: Option<PathBuf>) -> Facts {
        let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        Facts {
            // SAFETY: geteuid has no preconditions.
            root: unsafe { libc::geteuid() } == 0,
            overlay: filesystems.lines().any(|l| l.ends_with("\toverlay")),
            tun: Path::new("/dev/net/tun").exists(),
            qemu: which("qemu-system-x86_64"),
            accel: bulkhead_microvm::probe::detect(),
            mkfs_erofs: which("mkfs.erofs").is_some(),
            mkfs_ext4: which("mkfs.ext4").is_some(),
            guest_kernel: guest_kernel.map(|k| {
                let ok = k.is_file();
                (k, ok)
            }),
        }
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// One driver's verdict: can it run, what is missing, and notes.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub driver: &'static str,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

pub fn jail(f: &Facts) -> Verdict {
    let mut problems = Vec::new();
    if !f.root {
        problems.push("not root: the jail creates namespaces, mounts and cgroups".into());
    }
    if !f.overlay {
        problems.push("the kernel has no overlay file system".into());
    }
    let mut notes = Vec::new();
    if !f.tun {
        notes.push("no /dev/net/tun: sandboxes cannot get network access".into());
    }
    Verdict {
        driver: "jail",
        problems,
        notes,
    }
}

pub fn microvm(f: &Facts) -> Verdict {
    let mut problems = Vec::new();
    if f.qemu.is_none() {
        problems
            .push("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)".into());
    }
    for (ok, tool, pkg) in [
        (f.mkfs_erofs, "mkfs.erofs", "erofs-utils"),
        (f.mkfs_ext4, "mkfs.ext4", "e2fsprogs"),
    ] {
        if !ok {
            problems.push(format!("{tool} is missing (apt-get install {pkg})"));
        }
    }
    if !f.root {
        problems.push("not root: QEMU is started under per-sandbox uids".into());
    }
    match &f.guest_kernel {
        None => problems.push(
            "no guest kernel given: build one with scripts/guest-kernel.sh and pass \
             --guest-kernel DIR/bzImage"
                .into(),
        ),
        Some((k, false)) => problems.push(format!(
            "the guest kernel {} does not exist (scripts/guest-kernel.sh builds it)",
            k.display()
        )),
        Some(_) => {}
    }
    let accel = match f.accel.accel {
        Accel::Kvm => "KVM",
        Accel::Tcg => "TCG",
    };
    Verdict {
        driver: "microvm",
        problems,
        notes: vec![format!("acceleration: {accel}: {}", f.accel.reason)],
    }
}

pub fn report(verdicts: &[Verdict]) -> String {
    let mut out = String::new();
    for v in verdicts {
        let state = if v.problems.is_empty() {
            "can run here"
        } else {
            "cannot run here"
        };
        out.push_str(&format!("{}: {state}\n", v.driver));
        for p in &v.problems {
            out.push_str(&format!("  - {p}\n"));
        }
        for n in &v.notes {
            out.push_str(&format!("  * {n}\n"));
        }
    }
    out
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let facts = Facts::gather(args.guest_kernel);
    let verdicts = [jail(&facts), microvm(&facts)];
    print!("{}", report(&verdicts));
    // Success when at least one driver can run.
    Ok(if verdicts.iter().any(|v| v.problems.is_empty()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(accel: Accel, reason: &str) -> Facts {
        Facts {
            root: true,
            overlay: true,
            tun: true,
            qemu: Some("/usr/bin/qemu-system-x86_64".into()),
            accel: AccelReport {
                accel,
                reason: reason.into(),
            },
            mkfs_erofs: true,
            mkfs_ext4: true,
            guest_kernel: Some(("/k/bzImage".into(), true)),
        }
    }

    #[test]
    fn verdicts_say_what_is_missing_and_which_acceleration() {
        let f = facts(Accel::Tcg, "/dev/kvm is PVM (no VT-x/AMD-V ...)");
        let (j, m) = (jail(&f), microvm(&f));
        assert!(j.problems.is_empty() && m.problems.is_empty());
        let text = report(&[j, m]);
        assert!(text.contains("jail: can run here"), "{text}");
        assert!(text.contains("microvm: can run here"), "{text}");
        assert!(
            text.contains("acceleration: TCG: /dev/kvm is PVM"),
            "{text}"
        );

        let mut f = facts(Accel::Kvm, "hardware KVM");
        f.qemu = None;
        f.guest_kernel = None;
        f.tun = false;
        let m = microvm(&f);
        assert_eq!(m.problems.len(), 2, "{m:?}");
        assert!(m.problems[0].contains("apt-get install qemu-system-x86"));
        assert!(m.problems[1].contains("scripts/guest-kernel.sh"));
        assert!(m.notes[0].starts_with("acceleration: KVM"));
        let j = jail(&f);
        assert!(j.problems.is_empty() && j.notes[0].contains("/dev/net/tun"));
        f.root = false;
        assert!(report(&[jail(&f)]).contains("jail: cannot run here\n  - not root"));
    }
}
