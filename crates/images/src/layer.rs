//! Templates layered on another template: build steps run in a chroot of a copy of the parent's
//! tree (extra Debian packages, pinned `pip`/`npm` installs, files, shell commands).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::process::Command;

use crate::bootstrap::{TOOL_PATH, run_streaming};
use crate::finalize::{blocking, slim_and_neutralise};
use crate::recipe::sha256_hex;
use crate::{ImageError, Progress, Result, TemplateRecipe};

/// The host's CA bundle, used (never installed) for downloads during layer builds: on hosts
/// behind a TLS-inspecting proxy it is the only bundle that verifies PyPI and npm.
pub const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Inside the chroot: a tmpfs that exists only in the step's mount namespace, so the CA copy
/// and the npm cache never touch the tree.
const BUILD_CA: &str = "/tmp/bulkhead-build/ca.pem";

/// Runs in a private mount namespace (`unshare --mount --propagation private`): mounts what
/// package managers expect, then chroots. Everything it mounts disappears with the namespace
/// when the step ends, however it ends, and is never visible on the host.
/// `$1` = tree, `$2` = CA bundle on the host (or empty), `$3` = the step's script.
const CHROOT_PRELUDE: &str = r#"root=$1 ca=$2 script=$3
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t sysfs -o ro sysfs "$root/sys"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
if [ -e /etc/resolv.conf ]; then
  if [ -L "$root/etc/resolv.conf" ] || [ ! -e "$root/etc/resolv.conf" ]; then
    rm -f "$root/etc/resolv.conf"; : > "$root/etc/resolv.conf"
  fi
  mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
fi
mkdir -p "$root/tmp/bulkhead-build"
if [ -n "$ca" ]; then cp "$ca" "$root/tmp/bulkhead-build/ca.pem"; fi
exec chroot "$root" /bin/sh -ec "$script"
"#;

/// Proxy settings are passed through so builds work where the host needs a proxy.
const PASSED_THROUGH: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

/// The environment of every step: predictable locale and paths, the build CA for pip, npm and
/// Node, npm's cache on the namespace's tmpfs.
pub(crate) fn step_env(with_ca: bool) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("PATH", TOOL_PATH),
        ("HOME", "/root"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("DEBIAN_FRONTEND", "noninteractive"),
        ("TMPDIR", "/tmp"),
        ("npm_config_cache", "/tmp/bulkhead-build/npm-cache"),
        ("npm_config_update_notifier", "false"),
        ("PIP_NO_CACHE_DIR", "1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if with_ca {
        for k in [
            "PIP_CERT",
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
            "npm_config_cafile",
        ] {
            env.push((k.to_owned(), BUILD_CA.to_owned()));
        }
    }
    for k in PASSED_THROUGH {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    env
}

/// The command running `script` as root in `root` (see [`CHROOT_PRELUDE`]).
pub(crate) fn chroot_command(root: &Path, host_ca: Option<&Path>, script: &str) -> Command {
    let mut c = Command::new("unshare");
    c.env_clear()
        .envs(step_env(host_ca.is_some()))
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-ec",
        ])
        .arg(CHROOT_PRELUDE)
        .arg("bulkhead-chroot")
        .arg(root)
        .arg(host_ca.map_or(OsStr::new(""), Path::as_os_str))
        .arg(script);
    c
}

async fn run_in_chroot(
    root: &Path,
    host_ca: Option<&Path>,
    script: &str,
    display: &str,
    progress: &dyn Progress,
) -> Result<()> {
    let cmd = chroot_command(root, host_ca, script);
    let (status, tail) = run_streaming(cmd, display, progress).await?;
    if status.success() {
        Ok(())
    } else {
        Err(ImageError::Chroot {
            command: display.to_owned(),
            status: status.to_string(),
            tail,
        })
    }
}

/// Builds `recipe` (which has a parent) at `target` from the parent's finished tree.
pub(crate) async fn build_layer(
    recipe: &TemplateRecipe,
    parent_rootfs: &Path,
    target: &Path,
    host_ca: Option<&Path>,
    progress: &dyn Progress,
) -> Result<()> {
    let parent_id = recipe.parent.as_deref().map_or("parent", |p| p.id.as_str());
    progress.stage(&format!("copying the {parent_id} template's tree"));
    // cp -a keeps owners, modes, hard links and xattrs; reflinks make it nearly free on
    // filesystems that support them.
    let mut cp = Command::new("cp");
    cp.env("PATH", TOOL_PATH)
        .args(["-a", "--reflink=auto", "--"])
        .arg(parent_rootfs)
        .arg(target);
    let (status, tail) = run_streaming(cp, "cp -a", progress).await?;
    if !status.success() {
        return Err(ImageError::Copy {
            from: parent_rootfs.to_owned(),
            to: target.to_owned(),
            status: status.to_string(),
            tail,
        });
    }

    match host_ca {
        Some(ca) => progress.stage(&format!(
            "downloads inside the build trust the host's CA bundle {} (not installed in the \
             template)",
            ca.display()
        )),
        None => progress.stage("no host CA bundle: downloads trust the template's own CAs"),
    }

    if !recipe.packages.is_empty() {
        let mut packages: Vec<&str> = recipe.packages.iter().map(String::as_str).collect();
        packages.sort_unstable();
        packages.dedup();
        progress.stage(&format!(
            "installing Debian packages: {}",
            packages.join(" ")
        ));
        let script = format!(
            "apt-get update -q\napt-get install -y -q --no-install-recommends {}\napt-get clean",
            packages.join(" ")
        );
        run_in_chroot(target, host_ca, &script, "apt-get install", progress).await?;
    }

    let total = recipe.steps.len();
    for (i, step) in recipe.steps.iter().enumerate() {
        let what = step.describe();
        progress.stage(&format!("step {}/{total}: {what}", i + 1));
        match step {
            BuildStep::File(asset) => {
                let (root, asset) = (target.to_owned(), asset.clone());
                blocking(move || write_asset(&root, &asset)).await?;
            }
            other => {
                let script = other.render().unwrap_or_default();
                run_in_chroot(target, host_ca, &script, &what, progress).await?;
            }
        }
    }

    progress.stage("removing caches, documentation and host files");
    let root = target.to_owned();
    blocking(move || {
        for dir in ["root/.cache", "root/.npm", "root/.config/pip"] {
            let p = root.join(dir);
            if fs::symlink_metadata(&p).is_ok() {
                crate::fsutil::remove_tree(&p)?;
            }
        }
        slim_and_neutralise(&root)
    })
    .await
}

/// Writes an asset under `root` without following symlinks out of the tree: every existing
/// parent must be a real directory; missing ones are created 0755.
pub(crate) fn write_asset(root: &Path, asset: &FileAsset) -> Result<()> {
    asset.validate()?;
    let rel = asset.path.trim_start_matches('/');
    let dest = root.join(rel);
    let mut dir = root.to_path_buf();
    let parents: Vec<Component> = Path::new(rel).components().collect();
    for c in &parents[..parents.len().saturating_sub(1)] {
        dir.push(c);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::InvalidRecipe(format!(
                    "cannot write {}: {} in the tree is not a directory (or is a symlink)",
                    asset.path,
                    dir.display()
                )));
            }
            Err(_) => {
                fs::create_dir(&dir).map_err(ImageError::io("create", &dir))?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
                    .map_err(ImageError::io("set permissions on", &dir))?;
            }
        }
    }
    if let Ok(m) = fs::symlink_metadata(&dest) {
        if m.is_dir() {
            return Err(ImageError::InvalidRecipe(format!(
                "cannot write {}: it is a directory in the tree",
                asset.path
            )));
        }
        fs::remove_file(&dest).map_err(ImageError::io("replace", &dest))?;
    }
    fs::write(&dest, &asset.contents).map_err(ImageError::io("write", &dest))?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(asset.mode))
        .map_err(ImageError::io("set permissions on", &dest))
}

/// The host bundle to use for build-time downloads, if the host has one.
pub(crate) fn host_ca_bundle(configured: Option<&Path>) -> Option<PathBuf> {
    configured.filter(|p| p.is_file()).map(Path::to_path_buf)
}

/// Version of the layer machinery (chroot environment, flags passed to apt/pip/npm, the
/// clean-up after the steps). Part of every layered hash: bump it when they change the tree.
pub(crate) const LAYER_VERSION: u32 = 1;

/// One step of a layered template, run in order after the extra Debian packages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BuildStep {
    /// `pip install` of exact pins (`name==version`) into the system Python (/usr/local).
    Pip { packages: Vec<String> },
    /// `npm install -g` of exact pins (`name@version`, `@scope/name@version`).
    Npm { packages: Vec<String> },
    /// A shell command (`/bin/sh -ec`) run as root inside the tree.
    Run { command: String },
    /// A file written into the tree (root-owned, parent directories 0755).
    File(FileAsset),
}

/// A file to place in the tree. The serialised form (used for the hash and in `READY`) carries
/// the contents' SHA-256, not the contents, so the metadata stays small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAsset {
    path: String,
    mode: u32,
    sha256: String,
    #[serde(skip)]
    contents: Vec<u8>,
}

impl FileAsset {
    /// `path` is absolute inside the tree, e.g. `/opt/bulkhead/interpreter/kernels.json`.
    pub fn new(path: impl Into<String>, contents: impl Into<Vec<u8>>, mode: u32) -> Self {
        let contents = contents.into();
        FileAsset {
            path: path.into(),
            mode,
            sha256: sha256_hex(&contents),
            contents,
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn mode(&self) -> u32 {
        self.mode
    }

    pub fn contents(&self) -> &[u8] {
        &self.contents
    }

    pub(crate) fn validate(&self) -> Result<()> {
        // Checked on the string: `Path::components` would silently drop `.` segments.
        let normal = self.path.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        });
        if !normal {
            return Err(ImageError::InvalidRecipe(format!(
                "file path {:?} must be absolute without `.`/`..` components",
                self.path
            )));
        }
        if self.mode > 0o7777 {
            return Err(ImageError::InvalidRecipe(format!(
                "file {} has mode {:o}, which is not a permission mode",
                self.path, self.mode
            )));
        }
        if sha256_hex(&self.contents) != self.sha256 {
            // Happens for a recipe read back from `READY`: only the digest was stored.
            return Err(ImageError::InvalidRecipe(format!(
                "the contents of {} are missing (a recipe read from build metadata cannot be \
                 rebuilt; use the built-in recipe)",
                self.path
            )));
        }
        Ok(())
    }
}

impl BuildStep {
    /// Short description for progress output.
    pub fn describe(&self) -> String {
        match self {
            BuildStep::Pip { packages } => {
                format!("pip install ({} pinned packages)", packages.len())
            }
            BuildStep::Npm { packages } => format!("npm install -g {}", packages.join(" ")),
            BuildStep::Run { command } => format!("run: {command}"),
            BuildStep::File(f) => format!("write {} ({} bytes)", f.path, f.contents.len()),
        }
    }

    /// The shell command that performs the step inside the tree, or None for steps done from
    /// the host (files).
    pub fn render(&self) -> Option<String> {
        match self {
            BuildStep::Pip { packages } => Some(format!(
                "python3 -m pip install --no-cache-dir --no-input --disable-pip-version-check \
                 --root-user-action=ignore --progress-bar off --prefer-binary {}",
                quote_all(packages)
            )),
            BuildStep::Npm { packages } => Some(format!(
                "npm install --global --no-fund --no-audit --no-update-notifier --loglevel=http {}",
                quote_all(packages)
            )),
            BuildStep::Run { command } => Some(command.clone()),
            BuildStep::File(_) => None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        match self {
            BuildStep::Pip { packages } => check_pins(packages, "pip", is_pip_pin),
            BuildStep::Npm { packages } => check_pins(packages, "npm", is_npm_pin),
            BuildStep::Run { command } => {
                if command.trim().is_empty() {
                    Err(ImageError::InvalidRecipe("empty `run` step".into()))
                } else {
                    Ok(())
                }
            }
            BuildStep::File(f) => f.validate(),
        }
    }
}

fn check_pins(packages: &[String], tool: &str, ok: fn(&str) -> bool) -> Result<()> {
    if packages.is_empty() {
        return Err(ImageError::InvalidRecipe(format!("empty {tool} step")));
    }
    for p in packages {
        if !ok(p) {
            let shape = if tool == "pip" {
                "name==version"
            } else {
                "name@version"
            };
            return Err(ImageError::InvalidRecipe(format!(
                "{tool} package {p:?} is not pinned to an exact version ({shape})"
            )));
        }
    }
    Ok(())
}

/// `name==version` (PEP 508 name, PEP 440-ish version), nothing else (no ranges, URLs, extras).
pub(crate) fn is_pip_pin(p: &str) -> bool {
    let Some((name, version)) = p.split_once("==") else {
        return false;
    };
    !name.is_empty()
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && is_version(version, b"!+")
}

/// `name@version` or `@scope/name@version` with an exact version (no ranges or tags).
pub(crate) fn is_npm_pin(p: &str) -> bool {
    let (scoped, rest) = match p.strip_prefix('@') {
        Some(r) => (true, r),
        None => (false, p),
    };
    let Some((name, version)) = rest.rsplit_once('@') else {
        return false;
    };
    let name_ok = |n: &str| {
        !n.is_empty()
            && !n.starts_with('.')
            && n.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    };
    let names_ok = if scoped {
        matches!(name.split_once('/'), Some((s, n)) if name_ok(s) && name_ok(n))
    } else {
        name_ok(name)
    };
    names_ok
        && version.as_bytes()[..]
            .first()
            .is_some_and(u8::is_ascii_digit)
        && is_version(version, b"+")
}

fn is_version(v: &str, extra: &[u8]) -> bool {
    !v.is_empty()
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-') || extra.contains(&b))
}

/// Single-quotes each word for /bin/sh (pins are validated, but quoting keeps `!` and the like
/// literal regardless).
fn quote_all(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins() {
        for ok in [
            "numpy==2.4.6",
            "bash_kernel==0.10.0",
            "certifi==2026.10.18",
            "a.b-c==1!2.0+local",
        ] {
            assert!(is_pip_pin(ok), "{ok}");
        }
        for bad in [
            "numpy",
            "numpy>=2",
            "numpy==",
            "==1",
            "numpy==2; rm -rf /",
            "x==1 y==2",
            "-e==1",
        ] {
            assert!(!is_pip_pin(bad), "{bad}");
        }
        for ok in [
            "deno@2.9.6",
            "@types/node@18.19.130",
            "left-pad@1.3.0-rc.1+build",
        ] {
            assert!(is_npm_pin(ok), "{ok}");
        }
        for bad in [
            "deno",
            "deno@latest",
            "deno@^2",
            "@types@1.0.0",
            "Deno@1.0.0",
            "x@1 y@2",
            "@/x@1",
        ] {
            assert!(!is_npm_pin(bad), "{bad}");
        }
    }

    #[test]
    fn renders_steps() {
        let pip = BuildStep::Pip {
            packages: vec!["numpy==2.4.6".into(), "duckdb==2.0.0".into()],
        };
        let cmd = pip.render().unwrap();
        assert!(
            cmd.starts_with("python3 -m pip install --no-cache-dir"),
            "{cmd}"
        );
        assert!(cmd.ends_with(" 'numpy==2.4.6' 'duckdb==2.0.0'"), "{cmd}");
        let npm = BuildStep::Npm {
            packages: vec!["deno@2.9.6".into()],
        };
        assert_eq!(
            npm.render().unwrap(),
            "npm install --global --no-fund --no-audit --no-update-notifier --loglevel=http 'deno@2.9.6'"
        );
        let run = BuildStep::Run {
            command: "rm -f /x".into(),
        };
        assert_eq!(run.render().unwrap(), "rm -f /x");
        let file = BuildStep::File(FileAsset::new("/opt/a", "x", 0o644));
        assert_eq!(file.render(), None);
        assert_eq!(quote_all(&["it's".to_owned()]), r"'it'\''s'");
    }

    #[test]
    fn writes_assets_inside_the_tree_only() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        let a = FileAsset::new("/opt/bulkhead/interpreter/kernels.json", "{}\n", 0o644);
        write_asset(&root, &a).unwrap();
        let p = root.join("opt/bulkhead/interpreter/kernels.json");
        assert_eq!(fs::read(&p).unwrap(), b"{}\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        assert_eq!(
            fs::metadata(root.join("opt/bulkhead"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
        // Rewriting replaces the file.
        write_asset(
            &root,
            &FileAsset::new("/opt/bulkhead/interpreter/kernels.json", "[]", 0o600),
        )
        .unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"[]");

        // A symlinked directory could point out of the tree: refused, nothing written outside.
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("srv")).unwrap();
        let err = write_asset(&root, &FileAsset::new("/srv/x", "x", 0o644)).unwrap_err();
        assert!(matches!(err, ImageError::InvalidRecipe(_)), "{err:?}");
        assert!(!outside.join("x").exists());
        // So is a symlink at the file itself: it is replaced, not written through.
        std::os::unix::fs::symlink(outside.join("target"), root.join("etc/link")).unwrap();
        write_asset(&root, &FileAsset::new("/etc/link", "y", 0o644)).unwrap();
        assert!(!outside.join("target").exists());
        assert!(
            fs::symlink_metadata(root.join("etc/link"))
                .unwrap()
                .is_file()
        );
    }

    #[test]
    fn chroot_command_and_environment() {
        let cmd = chroot_command(
            Path::new("/t/rootfs"),
            Some(Path::new("/etc/ca.pem")),
            "echo hi",
        );
        let std = cmd.as_std();
        assert_eq!(std.get_program(), "unshare");
        let args: Vec<_> = std
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            &args[..6],
            [
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-ec"
            ]
        );
        assert_eq!(
            &args[7..],
            ["bulkhead-chroot", "/t/rootfs", "/etc/ca.pem", "echo hi"]
        );
        let env: Vec<(String, String)> = std
            .get_envs()
            .filter_map(|(k, v)| {
                Some((
                    k.to_string_lossy().into_owned(),
                    v?.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        for k in ["PIP_CERT", "NODE_EXTRA_CA_CERTS", "npm_config_cafile"] {
            assert!(env.contains(&(k.to_owned(), BUILD_CA.to_owned())), "{k}");
        }
        // The CA copy lives on the step's private tmpfs, never in the tree.
        assert!(BUILD_CA.starts_with("/tmp/"));
        assert!(CHROOT_PRELUDE.contains(r#"mount -t tmpfs -o mode=1777 tmpfs "$root/tmp""#));
        let no_ca = step_env(false);
        assert!(no_ca.iter().all(|(k, _)| k != "PIP_CERT"));
    }

    #[test]
    fn validates_steps() {
        BuildStep::File(FileAsset::new("/opt/bulkhead/a.json", "{}", 0o644))
            .validate()
            .unwrap();
        for bad in ["relative/a", "/", "/opt/../etc/passwd", "/opt/./a"] {
            assert!(
                BuildStep::File(FileAsset::new(bad, "x", 0o644))
                    .validate()
                    .is_err(),
                "{bad}"
            );
        }
        assert!(
            BuildStep::File(FileAsset::new("/a", "x", 0o100644))
                .validate()
                .is_err()
        );
        assert!(BuildStep::Pip { packages: vec![] }.validate().is_err());
        assert!(
            BuildStep::Npm {
                packages: vec!["deno".into()]
            }
            .validate()
            .is_err()
        );
        assert!(
            BuildStep::Run {
                command: " ".into()
            }
            .validate()
            .is_err()
        );

        // Read back from READY: digest only, contents gone.
        let f = FileAsset::new("/opt/a", "contents", 0o644);
        let json = serde_json::to_string(&BuildStep::File(f)).unwrap();
        assert!(!json.contains("contents\""), "{json}");
        let back: BuildStep = serde_json::from_str(&json).unwrap();
        assert!(back.validate().is_err());
    }
}
