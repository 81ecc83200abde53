//! Running processes for image builds: a predictable environment, output streamed line by
//! line to a [`Progress`] with a tail kept for errors, blocking filesystem work off the runtime,
//! and shell scripts run as root in a tree inside a private mount namespace.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::error::{ImageError, Result};
use crate::progress::Progress;

/// Lines of tool output kept for error messages.
const TAIL_LINES: usize = 40;

/// A PATH that contains the sbin directories even when the caller's does not (debootstrap and
/// chroot live in /usr/sbin).
pub(crate) const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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

/// A command with a predictable environment: C locale (we parse its output), no debconf
/// questions, sbin on PATH.
pub(crate) fn tool_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env("PATH", TOOL_PATH)
        .env("LC_ALL", "C")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env_remove("LANGUAGE");
    c
}

/// Runs `cmd`, feeding each output line (stdout and stderr) to `progress`, and returns the exit
/// status with the last lines of output for error messages.
pub(crate) async fn run_streaming(
    mut cmd: Command,
    display: &str,
    progress: &dyn Progress,
) -> Result<(ExitStatus, String)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Dropping the build future (e.g. server shutdown) must not leave the tool running.
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| ImageError::Spawn {
        command: display.to_owned(),
        source,
    })?;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward_lines(out, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward_lines(err, tx.clone()));
    }
    drop(tx);

    let mut tail: VecDeque<String> = VecDeque::with_capacity(TAIL_LINES);
    let mut keep = |line: String, progress: &dyn Progress| {
        progress.line(&line);
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    };
    let status = loop {
        tokio::select! {
            line = rx.recv() => match line {
                Some(line) => keep(line, progress),
                None => break child.wait().await,
            },
            status = child.wait() => {
                // A daemon started by a maintainer script could hold the pipes open forever:
                // after the tool exits, drain briefly and move on.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                while let Ok(Some(line)) = tokio::time::timeout_at(deadline, rx.recv()).await {
                    keep(line, progress);
                }
                break status;
            }
        }
    }
    .map_err(|source| ImageError::Spawn {
        command: display.to_owned(),
        source,
    })?;
    Ok((status, Vec::from(tail).join("\n")))
}

/// Sends lines to `tx`; a carriage-return progress line keeps only its last segment.
async fn forward_lines(r: impl AsyncRead + Unpin, tx: mpsc::UnboundedSender<String>) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                let line = text
                    .trim_end_matches(['\n', '\r'])
                    .rsplit('\r')
                    .next()
                    .unwrap_or("")
                    .to_owned();
                if !line.trim().is_empty() && tx.send(line).is_err() {
                    return;
                }
            }
        }
    }
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(ImageError::Io {
            action: "finish a background task for",
            path: "the image build".into(),
            source: std::io::Error::other(e),
        }),
    }
}

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

/// Runs `script` in the tree (see [`chroot_command`]); a failure reports `display` and the
/// output's tail.
pub(crate) async fn run_in_chroot(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn streams_lines_and_keeps_a_tail() {
        struct Collect(std::sync::Mutex<Vec<String>>);
        impl Progress for Collect {
            fn stage(&self, _: &str) {}
            fn line(&self, l: &str) {
                self.0.lock().unwrap().push(l.to_owned());
            }
            fn done(&self) {}
        }
        let p = Collect(Default::default());
        let mut c = tool_command("sh");
        c.args([
            "-c",
            "for i in $(seq 1 50); do echo out$i; done; printf 'a\\rb\\n'; echo err >&2; exit 3",
        ]);
        let (status, tail) = run_streaming(c, "sh", &p).await.unwrap();
        assert_eq!(status.code(), Some(3));
        let lines = p.0.lock().unwrap();
        assert_eq!(lines.len(), 52);
        assert!(
            lines.contains(&"b".to_owned()),
            "carriage return keeps the last segment"
        );
        assert!(lines.contains(&"err".to_owned()));
        assert_eq!(tail.lines().count(), TAIL_LINES);
        assert!(!tail.contains("out1\n"));
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
}
