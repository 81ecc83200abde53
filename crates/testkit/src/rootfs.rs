//! Template root filesystems for the driver tests, made of host binaries: the jail's and the
//! microvm driver's integration tests both start sandboxes on such a tree (a few tools, the
//! shared libraries they and any extra binary need, `root` and `user` accounts), and both find
//! their sandboxes' host processes by uid.

use std::collections::BTreeSet;
use std::fs;
use std::ops::Range;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A host tool's path (`/usr/bin`, `/bin`, `/usr/sbin`, `/sbin`); panics when it is missing.
pub fn which(tool: &str) -> PathBuf {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("host tool {tool} not found"))
}

/// Absolute paths in `ldd` output (`name => /path (addr)` and `/path (addr)` lines).
pub fn parse_ldd(out: &str) -> Vec<PathBuf> {
    out.lines()
        .filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once("=>") {
                Some((_, r)) => r.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            p.starts_with('/').then(|| PathBuf::from(p))
        })
        .collect()
}

/// The shared libraries (and the ELF interpreter) `bin` needs, per `ldd`.
pub fn libs(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("run ldd");
    parse_ldd(&String::from_utf8_lossy(&out.stdout))
}

/// What goes into a test template tree.
pub struct Rootfs<'a> {
    /// Host tools copied into `/bin`.
    pub tools: &'a [&'a str],
    /// Other host binaries whose libraries the tree needs (not copied themselves: e.g. an agent
    /// the driver mounts into the sandbox).
    pub libs_of: &'a [&'a Path],
    /// Directories to create (`tmp` gets mode 1777, `root` 0700).
    pub dirs: &'a [&'a str],
}

impl Rootfs<'_> {
    /// Builds the tree at `root`, owned by the caller (host root, like a real template): the
    /// directories, the tools and every library, `/etc/passwd` and `/etc/group` with `root` and
    /// `user` (1000), and `/etc/template-marker`, a file only the template has.
    pub fn build(&self, root: &Path) {
        for d in ["bin", "etc"].iter().chain(self.dirs) {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for (dir, mode) in [("tmp", 0o1777), ("root", 0o700)] {
            if self.dirs.contains(&dir) {
                fs::set_permissions(root.join(dir), fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        let mut need: BTreeSet<PathBuf> = self.libs_of.iter().flat_map(|b| libs(b)).collect();
        for t in self.tools {
            let src = which(t);
            fs::copy(&src, root.join("bin").join(t)).unwrap();
            need.extend(libs(&src));
        }
        for lib in need {
            let dst = root.join(lib.strip_prefix("/").unwrap());
            fs::create_dir_all(dst.parent().unwrap()).unwrap();
            fs::copy(&lib, &dst).unwrap();
        }
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
        )
        .unwrap();
        fs::write(
            root.join("etc/group"),
            "root:x:0:\ntty:x:5:\nuser:x:1000:\n",
        )
        .unwrap();
        fs::write(root.join("etc/template-marker"), "from the template\n").unwrap();
    }
}

/// Host processes whose real uid is in `uids` (a test's sandboxes), with that uid.
pub fn processes_of(uids: Range<u32>) -> Vec<(i32, u32)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let status = fs::read_to_string(e.path().join("status")).ok()?;
            let uid: u32 = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            uids.contains(&uid).then_some((pid, uid))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_absolute_paths() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 \
                   (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(out),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn our_own_process_is_found_by_its_uid() {
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        let found = processes_of(me..me + 1);
        assert!(
            found.iter().any(|(p, _)| *p == std::process::id() as i32),
            "{found:?}"
        );
    }
}
