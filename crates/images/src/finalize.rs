//! Turning a fresh Debian tree into a sandbox template: the extra CA, the `user` account,
//! slimming, and neutral host files. Everything here is covered by `FINALIZE_VERSION` in the
//! content hash: change behaviour, bump the version.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{ImageError, Result};
use crate::exec::{blocking, run_streaming, tool_command};
use crate::fsutil::unmount_under;
use crate::progress::Progress;

pub(crate) const USER_NAME: &str = "user";
pub(crate) const USER_UID: u32 = 1000;
pub(crate) const USER_GID: u32 = 1000;
/// Where the extra CA lands; update-ca-certificates only reads `*.crt` here.
pub(crate) const EXTRA_CA_PATH: &str = "usr/local/share/ca-certificates/bulkhead-extra.crt";

/// Keeps later `apt-get install`s inside a template (E2B build steps) as slim as the base.
const DPKG_SLIM_CFG: &str = "\
# Written by Bulkhead: sandboxes do not need documentation or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
";

pub(crate) const HOSTS: &str = "\
127.0.0.1\tlocalhost
127.0.1.1\tsandbox
::1\t\tlocalhost ip6-localhost ip6-loopback
ff02::1\t\tip6-allnodes
ff02::2\t\tip6-allrouters
";

pub(crate) async fn finalize(
    root: &Path,
    extra_ca: Option<&[u8]>,
    progress: &dyn Progress,
) -> Result<()> {
    // The tools unmount on success; a leftover mount would make the deletions below unsafe.
    unmount_under(root)?;
    if let Some(ca) = extra_ca {
        progress.stage("trusting the extra CA bundle inside the template");
        install_extra_ca(root, ca, progress).await?;
    }
    progress.stage("creating the sandbox user (uid 1000)");
    let r = root.to_owned();
    blocking(move || create_user(&r)).await?;
    progress.stage("removing documentation, caches and host-specific files");
    let r = root.to_owned();
    blocking(move || slim_and_neutralise(&r)).await
}

/// First `-----BEGIN CERTIFICATE-----` … `-----END CERTIFICATE-----` block, line endings
/// normalised.
fn first_pem_block(pem: &str) -> Option<String> {
    let pem = pem.replace("\r\n", "\n");
    let start = pem.find("-----BEGIN CERTIFICATE-----")?;
    let end_marker = "-----END CERTIFICATE-----";
    let end = pem[start..].find(end_marker)? + start + end_marker.len();
    Some(pem[start..end].to_owned())
}

async fn install_extra_ca(root: &Path, ca: &[u8], progress: &dyn Progress) -> Result<()> {
    let text = String::from_utf8_lossy(ca);
    let Some(first) = first_pem_block(&text) else {
        return Err(ImageError::InvalidRecipe(
            "the extra CA bundle holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    };
    let dest = root.join(EXTRA_CA_PATH);
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).map_err(ImageError::io("create", dir))?;
    }
    let mut bytes = text.replace("\r\n", "\n").into_bytes();
    if !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    fs::write(&dest, &bytes).map_err(ImageError::io("write", &dest))?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o644))
        .map_err(ImageError::io("set permissions on", &dest))?;

    let mut cmd = tool_command("chroot");
    cmd.arg(root).arg("/usr/sbin/update-ca-certificates");
    let display = "chroot <rootfs> update-ca-certificates";
    let (status, tail) = run_streaming(cmd, display, progress).await?;
    if !status.success() {
        return Err(ImageError::Chroot {
            command: display.to_owned(),
            status: status.to_string(),
            tail,
        });
    }
    // update-ca-certificates skips files it cannot parse without failing: check it took ours.
    let bundle_path = root.join("etc/ssl/certs/ca-certificates.crt");
    let bundle = fs::read_to_string(&bundle_path).map_err(ImageError::io("read", &bundle_path))?;
    if !bundle.contains(&first) {
        return Err(ImageError::Chroot {
            command: display.to_owned(),
            status: "the extra CA is missing from /etc/ssl/certs/ca-certificates.crt".into(),
            tail,
        });
    }
    Ok(())
}

/// Adds `user` (uid/gid 1000, /home/user, bash) by editing the account files directly: same
/// result as useradd, without running anything in the tree, and deterministic (no dates).
pub(crate) fn create_user(root: &Path) -> Result<()> {
    let etc = root.join("etc");
    let passwd = read(&etc.join("passwd"))?;
    if !passwd.lines().any(|l| l.starts_with("root:x:0:0:")) {
        return Err(ImageError::InvalidRecipe(
            "the bootstrapped tree has no root account in /etc/passwd".into(),
        ));
    }
    let existing = passwd
        .lines()
        .find(|l| l.split(':').nth(2) == Some(&USER_UID.to_string()));
    match existing {
        Some(l) if l.starts_with(&format!("{USER_NAME}:")) => return Ok(()),
        Some(l) => {
            return Err(ImageError::InvalidRecipe(format!(
                "uid {USER_UID} is already taken in the tree: {l}"
            )));
        }
        None => {}
    }
    append(
        &etc.join("passwd"),
        &format!("{USER_NAME}:x:{USER_UID}:{USER_GID}::/home/{USER_NAME}:/bin/bash\n"),
    )?;
    append(&etc.join("group"), &format!("{USER_NAME}:x:{USER_GID}:\n"))?;
    // `*`: no password login; root inside the sandbox can still `su user`.
    append(
        &etc.join("shadow"),
        &format!("{USER_NAME}:*::0:99999:7:::\n"),
    )?;
    if etc.join("gshadow").exists() {
        append(&etc.join("gshadow"), &format!("{USER_NAME}:!::\n"))?;
    }

    let home = root.join("home").join(USER_NAME);
    fs::create_dir_all(&home).map_err(ImageError::io("create", &home))?;
    fs::set_permissions(&home, fs::Permissions::from_mode(0o755))
        .map_err(ImageError::io("set permissions on", &home))?;
    copy_skel(&etc.join("skel"), &home)?;
    chown_tree(&home)
}

fn copy_skel(skel: &Path, dest: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(skel) else {
        return Ok(()); // no skeleton: an empty home is fine
    };
    for e in entries.flatten() {
        let from = e.path();
        let to = dest.join(e.file_name());
        let meta = fs::symlink_metadata(&from).map_err(ImageError::io("inspect", &from))?;
        if meta.is_dir() {
            fs::create_dir_all(&to).map_err(ImageError::io("create", &to))?;
            copy_skel(&from, &to)?;
        } else if meta.is_file() {
            fs::copy(&from, &to).map_err(ImageError::io("copy", &from))?;
        }
    }
    Ok(())
}

fn chown_tree(p: &Path) -> Result<()> {
    std::os::unix::fs::lchown(p, Some(USER_UID), Some(USER_GID))
        .map_err(ImageError::io("chown", p))?;
    let meta = fs::symlink_metadata(p).map_err(ImageError::io("inspect", p))?;
    if meta.is_dir() {
        for e in fs::read_dir(p)
            .map_err(ImageError::io("list", p))?
            .flatten()
        {
            chown_tree(&e.path())?;
        }
    }
    Ok(())
}

fn read(p: &Path) -> Result<String> {
    fs::read_to_string(p).map_err(ImageError::io("read", p))
}

fn append(p: &Path, line: &str) -> Result<()> {
    // Appending keeps the file's owner and mode (shadow stays root:shadow 0640).
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(p)
        .map_err(ImageError::io("open", p))?;
    f.write_all(line.as_bytes())
        .map_err(ImageError::io("write", p))
}

/// Deletes what a sandbox never reads, and replaces files the tools copied from the build host
/// (hostname, resolv.conf) with neutral ones, so the hash alone determines the tree.
pub(crate) fn slim_and_neutralise(root: &Path) -> Result<()> {
    let dev = fs::symlink_metadata(root)
        .map_err(ImageError::io("inspect", root))?
        .dev();
    for dir in [
        "usr/share/man",
        "usr/share/info",
        "usr/share/groff",
        "usr/share/lintian",
        "usr/share/linda",
        "var/cache/man",
        "tmp",
        "var/tmp",
    ] {
        clear_dir(&root.join(dir), dev, &|_| false)?;
    }
    clear_dir(&root.join("usr/share/locale"), dev, &|name| {
        name == "locale.alias"
    })?;
    // Keep licences: each package's copyright file stays.
    let doc = root.join("usr/share/doc");
    if let Ok(entries) = fs::read_dir(&doc) {
        for e in entries.flatten() {
            let p = e.path();
            if fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                clear_dir(&p, dev, &|name| name == "copyright")?;
            }
        }
    }
    clear_dir(&root.join("var/lib/apt/lists"), dev, &|name| {
        name == "lock" || name == "partial"
    })?;
    clear_dir(&root.join("var/cache/apt"), dev, &|name| name == "archives")?;
    clear_dir(&root.join("var/cache/apt/archives"), dev, &|name| {
        name == "lock" || name == "partial"
    })?;
    for (dir, suffix) in [("var/cache/debconf", "-old"), ("var/lib/dpkg", "-old")] {
        if let Ok(entries) = fs::read_dir(root.join(dir)) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().ends_with(suffix) {
                    let p = e.path();
                    fs::remove_file(&p).map_err(ImageError::io("delete", &p))?;
                }
            }
        }
    }
    truncate_logs(&root.join("var/log"))?;

    write_file(root, "etc/dpkg/dpkg.cfg.d/bulkhead-slim", DPKG_SLIM_CFG)?;
    // The jail sets the hostname per sandbox; this is only the fallback.
    write_file(root, "etc/hostname", "sandbox\n")?;
    write_file(root, "etc/hosts", HOSTS)?;
    // Sandboxes have no network unless egress is granted, and then the driver provides DNS.
    write_file(
        root,
        "etc/resolv.conf",
        "# Provided by Bulkhead when the sandbox is allowed network access.\n",
    )?;
    Ok(())
}

/// Removes the entries of `dir` for which `keep(name)` is false; a missing dir is fine.
fn clear_dir(dir: &Path, dev: u64, keep: &dyn Fn(&str) -> bool) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        if keep(&e.file_name().to_string_lossy()) {
            continue;
        }
        let p = e.path();
        let meta = fs::symlink_metadata(&p).map_err(ImageError::io("inspect", &p))?;
        if meta.is_dir() {
            if meta.dev() != dev {
                return Err(ImageError::StillMounted { path: p });
            }
            fs::remove_dir_all(&p).map_err(ImageError::io("delete", &p))?;
        } else {
            fs::remove_file(&p).map_err(ImageError::io("delete", &p))?;
        }
    }
    Ok(())
}

/// Empties log files but keeps them: some (btmp, wtmp, lastlog) carry ownership and modes that
/// login tools expect.
fn truncate_logs(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let p = e.path();
        let meta = fs::symlink_metadata(&p).map_err(ImageError::io("inspect", &p))?;
        if meta.is_dir() {
            truncate_logs(&p)?;
        } else if meta.is_file() && meta.len() > 0 {
            fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&p)
                .map_err(ImageError::io("truncate", &p))?;
        }
    }
    Ok(())
}

/// Replaces `rel` under `root` with `contents` (0644), removing a symlink rather than writing
/// through it.
pub(crate) fn write_file(root: &Path, rel: &str, contents: &str) -> Result<()> {
    let p = root.join(rel);
    if let Some(dir) = p.parent() {
        fs::create_dir_all(dir).map_err(ImageError::io("create", dir))?;
    }
    if fs::symlink_metadata(&p).is_ok() {
        fs::remove_file(&p).map_err(ImageError::io("replace", &p))?;
    }
    fs::write(&p, contents).map_err(ImageError::io("write", &p))?;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644))
        .map_err(ImageError::io("set permissions on", &p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        for d in [
            "etc/skel",
            "usr/share/doc/libc6",
            "usr/share/man/man1",
            "usr/share/locale/de/LC_MESSAGES",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
            "var/log/apt",
            "tmp",
        ] {
            fs::create_dir_all(r.join(d)).unwrap();
        }
        fs::write(r.join("etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        fs::write(r.join("etc/group"), "root:x:0:\n").unwrap();
        fs::write(r.join("etc/shadow"), "root:*:19000:0:99999:7:::\n").unwrap();
        fs::write(r.join("etc/gshadow"), "root:*::\n").unwrap();
        fs::write(r.join("etc/skel/.bashrc"), "# bashrc\n").unwrap();
        fs::write(r.join("etc/hostname"), "buildhost\n").unwrap();
        std::os::unix::fs::symlink(
            "/run/systemd/resolve/stub-resolv.conf",
            r.join("etc/resolv.conf"),
        )
        .unwrap();
        fs::write(r.join("usr/share/doc/libc6/copyright"), "GPL").unwrap();
        fs::write(r.join("usr/share/doc/libc6/changelog.gz"), "x").unwrap();
        fs::write(r.join("usr/share/man/man1/ls.1.gz"), "x").unwrap();
        fs::write(r.join("usr/share/locale/locale.alias"), "x").unwrap();
        fs::write(r.join("usr/share/locale/de/LC_MESSAGES/x.mo"), "x").unwrap();
        fs::write(
            r.join("var/lib/apt/lists/deb_dists_bookworm_InRelease"),
            "x",
        )
        .unwrap();
        fs::write(r.join("var/lib/apt/lists/lock"), "").unwrap();
        fs::write(r.join("var/cache/apt/pkgcache.bin"), "x").unwrap();
        fs::write(r.join("var/cache/apt/archives/libc6.deb"), "x").unwrap();
        fs::write(r.join("var/log/apt/history.log"), "lots").unwrap();
        fs::write(r.join("tmp/junk"), "x").unwrap();
        t
    }

    #[test]
    fn creates_the_user_once() {
        let t = fake_tree();
        let r = t.path();
        create_user(r).unwrap();
        create_user(r).unwrap();
        let passwd = fs::read_to_string(r.join("etc/passwd")).unwrap();
        assert_eq!(
            passwd
                .lines()
                .filter(|l| l.starts_with("user:"))
                .collect::<Vec<_>>(),
            ["user:x:1000:1000::/home/user:/bin/bash"]
        );
        assert!(
            fs::read_to_string(r.join("etc/group"))
                .unwrap()
                .contains("user:x:1000:\n")
        );
        assert!(
            fs::read_to_string(r.join("etc/shadow"))
                .unwrap()
                .contains("user:*::")
        );
        assert!(
            fs::read_to_string(r.join("etc/gshadow"))
                .unwrap()
                .contains("user:!::")
        );
        assert!(r.join("home/user/.bashrc").is_file());
        if nix::unistd::geteuid().is_root() {
            let m = fs::metadata(r.join("home/user/.bashrc")).unwrap();
            assert_eq!((m.uid(), m.gid()), (1000, 1000));
        }
    }

    #[test]
    fn refuses_a_taken_uid() {
        let t = fake_tree();
        let r = t.path();
        fs::write(
            r.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\nbob:x:1000:1000::/home/bob:/bin/sh\n",
        )
        .unwrap();
        assert!(create_user(r).is_err());
    }

    #[test]
    fn slims_and_neutralises() {
        let t = fake_tree();
        let r = t.path();
        slim_and_neutralise(r).unwrap();
        assert!(r.join("usr/share/doc/libc6/copyright").exists());
        assert!(!r.join("usr/share/doc/libc6/changelog.gz").exists());
        assert!(!r.join("usr/share/man/man1").exists());
        assert!(r.join("usr/share/locale/locale.alias").exists());
        assert!(!r.join("usr/share/locale/de").exists());
        assert!(
            !r.join("var/lib/apt/lists/deb_dists_bookworm_InRelease")
                .exists()
        );
        assert!(r.join("var/lib/apt/lists/partial").is_dir());
        assert!(!r.join("var/cache/apt/pkgcache.bin").exists());
        assert!(!r.join("var/cache/apt/archives/libc6.deb").exists());
        assert!(r.join("var/cache/apt/archives/partial").is_dir());
        assert_eq!(
            fs::metadata(r.join("var/log/apt/history.log"))
                .unwrap()
                .len(),
            0
        );
        assert!(!r.join("tmp/junk").exists());
        assert_eq!(
            fs::read_to_string(r.join("etc/hostname")).unwrap(),
            "sandbox\n"
        );
        let resolv = fs::symlink_metadata(r.join("etc/resolv.conf")).unwrap();
        assert!(resolv.is_file(), "symlink replaced by a file");
        assert!(r.join("etc/dpkg/dpkg.cfg.d/bulkhead-slim").is_file());
    }

    #[test]
    fn pem_blocks() {
        let pem = "junk\r\n-----BEGIN CERTIFICATE-----\r\nAAA\r\n-----END CERTIFICATE-----\r\n\
                   -----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----\n";
        assert_eq!(
            first_pem_block(pem).unwrap(),
            "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----"
        );
        assert_eq!(first_pem_block("nothing"), None);
    }
}
