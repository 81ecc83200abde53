//! Running the bootstrap tool: choosing (or installing) mmdebstrap/debootstrap, finding the
//! host's Debian mirror, probing it, and streaming the tool's output to a [`Progress`].

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::recipe::{TemplateRecipe, VARIANT};
use crate::{ImageError, Progress, Result};

/// Used when the host's APT sources have no entry for the suite (e.g. a non-Debian host).
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Lines of tool output kept for error messages.
const TAIL_LINES: usize = 40;

/// A PATH that contains the sbin directories even when the caller's does not (debootstrap and
/// chroot live in /usr/sbin).
pub(crate) const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The program that creates the Debian tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootstrapTool {
    /// Preferred: apt resolves and downloads in parallel, so it is the faster of the two.
    Mmdebstrap,
    Debootstrap,
}

impl BootstrapTool {
    /// Program and Debian package name.
    pub fn name(self) -> &'static str {
        match self {
            BootstrapTool::Mmdebstrap => "mmdebstrap",
            BootstrapTool::Debootstrap => "debootstrap",
        }
    }

    /// What an operator runs to install it.
    pub fn install_command(self) -> String {
        format!("apt-get install -y {}", self.name())
    }
}

/// The Debian mirror the host's APT uses for `suite`, if any: the first `URIs:` of a deb822
/// stanza in /etc/apt/sources.list.d/debian.sources whose `Suites:` lists it, else the first
/// matching `deb` line of /etc/apt/sources.list. Taken as-is (plain http on our hosts), so APT
/// inside the build goes wherever the host's APT goes and never meets a TLS-inspecting proxy.
pub fn host_mirror(suite: &str) -> Option<String> {
    if let Ok(text) = std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        && let Some(m) = parse_deb822(&text, suite)
    {
        return Some(m);
    }
    std::fs::read_to_string("/etc/apt/sources.list")
        .ok()
        .and_then(|text| parse_sources_list(&text, suite))
}

fn usable_uri(uri: &str) -> bool {
    uri.starts_with("http://") || uri.starts_with("https://") || uri.starts_with("file:/")
}

pub(crate) fn parse_deb822(text: &str, suite: &str) -> Option<String> {
    for stanza in text.split("\n\n") {
        let mut types = "";
        let mut uris = "";
        let mut suites = "";
        let mut enabled = true;
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "types" => types = v,
                    "uris" => uris = v,
                    "suites" => suites = v,
                    "enabled" => enabled = v.trim() != "no",
                    _ => {}
                }
            }
        }
        if enabled
            && types.split_whitespace().any(|t| t == "deb")
            && suites.split_whitespace().any(|s| s == suite)
            && let Some(uri) = uris.split_whitespace().find(|u| usable_uri(u))
        {
            return Some(uri.trim_end_matches('/').to_owned());
        }
    }
    None
}

pub(crate) fn parse_sources_list(text: &str, suite: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            continue;
        }
        let mut rest: Vec<&str> = words.collect();
        // Options: `[arch=amd64 signed-by=…]`, possibly spread over several words.
        if rest.first().is_some_and(|w| w.starts_with('[')) {
            let end = rest.iter().position(|w| w.ends_with(']'))?;
            rest.drain(..=end);
        }
        if let [uri, dist, ..] = rest.as_slice()
            && *dist == suite
            && usable_uri(uri)
        {
            return Some(uri.trim_end_matches('/').to_owned());
        }
    }
    None
}

/// Finds `only` if given, else mmdebstrap, else debootstrap.
pub(crate) fn find_tool(only: Option<BootstrapTool>) -> Option<(BootstrapTool, PathBuf)> {
    let candidates = match only {
        Some(t) => vec![t],
        None => vec![BootstrapTool::Mmdebstrap, BootstrapTool::Debootstrap],
    };
    for tool in candidates {
        for dir in TOOL_PATH.split(':') {
            let p = Path::new(dir).join(tool.name());
            if is_executable(&p) {
                return Some((tool, p));
            }
        }
    }
    None
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `apt-get install -y <tool>`, with an `apt-get update` and retry if the first attempt fails
/// (a fresh host often has no package lists).
pub(crate) async fn install_tool(tool: BootstrapTool, progress: &dyn Progress) -> Result<()> {
    let command = tool.install_command();
    progress.stage(&format!("installing the bootstrap tool: {command}"));
    let install = || {
        let mut c = tool_command("apt-get");
        c.args(["install", "-y", tool.name()]);
        c
    };
    let (status, _) = run_streaming(install(), "apt-get install", progress).await?;
    if status.success() {
        return Ok(());
    }
    let mut update = tool_command("apt-get");
    update.arg("update");
    run_streaming(update, "apt-get update", progress).await?;
    let (status, tail) = run_streaming(install(), "apt-get install", progress).await?;
    if status.success() {
        Ok(())
    } else {
        Err(ImageError::ToolInstall {
            command,
            status: status.to_string(),
            tail,
        })
    }
}

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

/// The bootstrap command for `recipe`, writing a fresh tree at `target` (which must not exist).
pub(crate) fn bootstrap_command(
    tool: BootstrapTool,
    program: &Path,
    recipe: &TemplateRecipe,
    target: &Path,
    mirror: &str,
) -> Command {
    let mut packages: Vec<&str> = recipe.packages.iter().map(String::as_str).collect();
    packages.sort_unstable();
    packages.dedup();
    let include = format!("--include={}", packages.join(","));
    let mut c = tool_command(program);
    match tool {
        BootstrapTool::Mmdebstrap => {
            c.args([
                "--mode=root",
                &format!("--variant={VARIANT}"),
                "--format=directory",
                // Package-level lines (apt/dpkg) for the progress display.
                "--verbose",
                "--aptopt=Acquire::Retries \"3\"",
            ]);
        }
        BootstrapTool::Debootstrap => {
            c.args([&format!("--variant={VARIANT}"), "--components=main"]);
        }
    }
    if !packages.is_empty() {
        c.arg(include);
    }
    c.arg(&recipe.suite).arg(target).arg(mirror);
    c
}

/// Checks that `<mirror>/dists/<suite>/InRelease` answers, so an unreachable mirror fails in
/// seconds with a clear message instead of after the tool's retries. Honours `http_proxy`.
pub(crate) async fn probe_mirror(mirror: &str, suite: &str) -> std::result::Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(15), probe_inner(mirror, suite)).await {
        Ok(r) => r,
        Err(_) => Err("no answer within 15 s".to_owned()),
    }
}

async fn probe_inner(mirror: &str, suite: &str) -> std::result::Result<(), String> {
    let (scheme, rest) = mirror
        .split_once("://")
        .ok_or_else(|| format!("{mirror:?} is not a URL"))?;
    if scheme == "file" {
        let p = Path::new(rest).join("dists").join(suite);
        return if p.is_dir() {
            Ok(())
        } else {
            Err(format!("{} does not exist", p.display()))
        };
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        other => return Err(format!("unsupported URL scheme {other:?}")),
    };
    let host = host_of(authority);
    let target_addr = with_port(authority, default_port);
    let url_path = format!("{}/dists/{suite}/InRelease", path.trim_end_matches('/'));

    let proxy = if scheme == "http" && !no_proxy_matches(host) {
        ["http_proxy", "HTTP_PROXY"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    } else {
        None
    };

    if scheme == "https" {
        // Without a TLS stack here, reaching the port is the best cheap signal; the tool
        // reports certificate problems itself.
        if ["https_proxy", "HTTPS_PROXY"]
            .iter()
            .any(|k| std::env::var_os(k).is_some())
        {
            return Ok(());
        }
        tokio::net::TcpStream::connect(&target_addr)
            .await
            .map_err(|e| format!("cannot connect to {target_addr}: {e}"))?;
        return Ok(());
    }

    let (connect_to, request_target) = match &proxy {
        Some(p) => {
            let p = p.trim_start_matches("http://").trim_end_matches('/');
            let p = p.rsplit('@').next().unwrap_or(p);
            (with_port(p, 80), format!("http://{authority}{url_path}"))
        }
        None => (target_addr.clone(), url_path.clone()),
    };
    let mut stream = tokio::net::TcpStream::connect(&connect_to)
        .await
        .map_err(|e| format!("cannot connect to {connect_to}: {e}"))?;
    let request = format!(
        "HEAD {request_target} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: bulkhead-images\r\n\
         Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send a request to {connect_to}: {e}"))?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader
        .read_line(&mut status_line)
        .await
        .map_err(|e| format!("no HTTP answer from {connect_to}: {e}"))?;
    let code: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer from {connect_to}: {status_line:?}"))?;
    match code {
        200..=399 => Ok(()),
        404 => Err(format!("suite {suite} not found (HTTP 404 for {url_path})")),
        other => Err(format!("HTTP {other} for {url_path}")),
    }
}

fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.split(':').next().unwrap_or(authority)
}

fn with_port(authority: &str, default: u16) -> String {
    let has_port = match authority.rfind(']') {
        Some(i) => authority[i..].contains(':'),
        None => authority.contains(':'),
    };
    if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:{default}")
    }
}

fn no_proxy_matches(host: &str) -> bool {
    // Loopback never goes through a proxy (curl and apt behave the same way).
    if matches!(host, "localhost" | "127.0.0.1" | "::1") {
        return true;
    }
    let list = std::env::var("no_proxy")
        .or_else(|_| std::env::var("NO_PROXY"))
        .unwrap_or_default();
    list.split(',').map(str::trim).any(|d| {
        !d.is_empty()
            && (d == "*"
                || host == d.trim_start_matches('.')
                || host.ends_with(&format!(".{}", d.trim_start_matches('.'))))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
";

    #[test]
    fn mirror_from_deb822() {
        assert_eq!(
            parse_deb822(DEB822, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        assert_eq!(
            parse_deb822(DEB822, "bookworm-security").as_deref(),
            Some("http://deb.debian.org/debian-security")
        );
        assert_eq!(parse_deb822(DEB822, "trixie"), None);
        let disabled = "Types: deb\nURIs: http://x/debian\nSuites: bookworm\nEnabled: no\n";
        assert_eq!(parse_deb822(disabled, "bookworm"), None);
        let src_only = "Types: deb-src\nURIs: http://x/debian\nSuites: bookworm\n";
        assert_eq!(parse_deb822(src_only, "bookworm"), None);
    }

    #[test]
    fn mirror_from_sources_list() {
        let text = "\
# deb http://commented/debian bookworm main
deb-src http://src/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main contrib
deb http://other/debian bookworm-updates main
";
        assert_eq!(
            parse_sources_list(text, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            parse_sources_list(text, "bookworm-updates").as_deref(),
            Some("http://other/debian")
        );
        assert_eq!(
            parse_sources_list("deb cdrom:[x]/ bookworm main", "bookworm"),
            None
        );
    }

    #[test]
    fn authority_helpers() {
        assert_eq!(host_of("deb.debian.org"), "deb.debian.org");
        assert_eq!(host_of("[::1]:8080"), "::1");
        assert_eq!(with_port("deb.debian.org", 80), "deb.debian.org:80");
        assert_eq!(with_port("h:3142", 80), "h:3142");
        assert_eq!(with_port("[::1]", 80), "[::1]:80");
    }

    #[test]
    fn commands_have_the_recipe() {
        let r = TemplateRecipe::base();
        let c = bootstrap_command(
            BootstrapTool::Debootstrap,
            Path::new("/usr/sbin/debootstrap"),
            &r,
            Path::new("/t"),
            "http://m/debian",
        );
        let args: Vec<String> = c
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "--variant=minbase",
                "--components=main",
                "--include=bash,ca-certificates,coreutils,curl,git,iproute2,less,netbase,procps,python3",
                "bookworm",
                "/t",
                "http://m/debian"
            ]
        );
        let c = bootstrap_command(
            BootstrapTool::Mmdebstrap,
            Path::new("/usr/bin/mmdebstrap"),
            &r,
            Path::new("/t"),
            "http://m/debian",
        );
        let args: Vec<String> = c
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(args.contains(&"--mode=root".to_owned()));
        assert!(args.ends_with(&["bookworm".into(), "/t".into(), "http://m/debian".into()]));
    }

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

    #[tokio::test]
    async fn probe_reports_unreachable_mirrors() {
        // Port 9 (discard) on loopback is closed on any sane host.
        let err = probe_mirror("http://127.0.0.1:9/debian", "bookworm")
            .await
            .unwrap_err();
        assert!(err.contains("cannot connect"), "{err}");
        let err = probe_mirror("ftp://x/debian", "bookworm")
            .await
            .unwrap_err();
        assert!(err.contains("unsupported"), "{err}");
    }
}
