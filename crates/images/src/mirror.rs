//! The Debian mirror a build uses: found in the host's APT sources (deb822 or one-line form),
//! and probed before a build so an unreachable mirror fails in seconds with a clear message.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::error::{ImageError, ProbeError, Result};
use crate::progress::Progress;

/// Used when the host's APT sources have no entry for the suite (e.g. a non-Debian host).
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

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

/// Checks that `<mirror>/dists/<suite>/InRelease` answers, so an unreachable mirror fails in
/// seconds with a clear message instead of after the tool's retries. Honours `http_proxy`.
pub(crate) async fn probe_mirror(mirror: &str, suite: &str) -> std::result::Result<(), ProbeError> {
    match tokio::time::timeout(Duration::from_secs(15), probe_inner(mirror, suite)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout),
    }
}

/// [`probe_mirror`] as a build step: reported to `progress`, failing with the operator's fix.
pub(crate) async fn check(mirror: &str, suite: &str, progress: &dyn Progress) -> Result<()> {
    progress.stage(&format!("checking the mirror {mirror}"));
    probe_mirror(mirror, suite)
        .await
        .map_err(|reason| ImageError::MirrorUnreachable {
            mirror: mirror.to_owned(),
            reason,
        })
}

async fn probe_inner(mirror: &str, suite: &str) -> std::result::Result<(), ProbeError> {
    let (scheme, rest) = mirror
        .split_once("://")
        .ok_or_else(|| ProbeError::NotAUrl(mirror.to_owned()))?;
    if scheme == "file" {
        let p = Path::new(rest).join("dists").join(suite);
        return if p.is_dir() {
            Ok(())
        } else {
            Err(ProbeError::NoSuite(p))
        };
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        other => return Err(ProbeError::Scheme(other.to_owned())),
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
            .map_err(|source| ProbeError::Connect {
                addr: target_addr.clone(),
                source,
            })?;
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
        .map_err(|source| ProbeError::Connect {
            addr: connect_to.clone(),
            source,
        })?;
    let request = format!(
        "HEAD {request_target} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: bulkhead-images\r\n\
         Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|source| ProbeError::Send {
            addr: connect_to.clone(),
            source,
        })?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader
        .read_line(&mut status_line)
        .await
        .map_err(|source| ProbeError::NoAnswer {
            addr: connect_to.clone(),
            source,
        })?;
    let code: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| ProbeError::NotHttp {
            addr: connect_to.clone(),
            line: status_line.clone(),
        })?;
    match code {
        200..=399 => Ok(()),
        404 => Err(ProbeError::SuiteNotFound {
            suite: suite.to_owned(),
            path: url_path,
        }),
        status => Err(ProbeError::Status {
            status,
            path: url_path,
        }),
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

    #[tokio::test]
    async fn probe_reports_unreachable_mirrors() {
        // Port 9 (discard) on loopback is closed on any sane host.
        let err = probe_mirror("http://127.0.0.1:9/debian", "bookworm")
            .await
            .unwrap_err();
        assert!(matches!(err, ProbeError::Connect { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("cannot connect to 127.0.0.1:9: "),
            "{err}"
        );
        let err = probe_mirror("ftp://x/debian", "bookworm")
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), r#"unsupported URL scheme "ftp""#);
        let err = probe_mirror("deb.debian.org", "bookworm")
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), r#""deb.debian.org" is not a URL"#);
    }
}
