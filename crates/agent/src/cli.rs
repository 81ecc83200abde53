//! Command-line interface of `bulkhead-agent`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use clap::Parser;

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket path (created with mode 0600; a stale socket is replaced).
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("`unix:` needs a socket path, e.g. unix:/run/agent.sock".into());
            }
            Ok(ListenAddr::Unix(PathBuf::from(path)))
        } else if let Some(addr) = s.strip_prefix("tcp:") {
            addr.parse().map(ListenAddr::Tcp).map_err(|e| {
                format!("invalid TCP address {addr:?} ({e}); use e.g. tcp:127.0.0.1:49983")
            })
        } else {
            Err(format!(
                "invalid listen address {s:?}: use unix:/path/to.sock or tcp:HOST:PORT"
            ))
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// The in-sandbox agent of Bulkhead: serves the envd API (processes, filesystem, file
/// transfer) that the E2B SDKs speak. Runs as the sandbox's init process.
#[derive(Debug, Clone, Parser)]
#[command(name = "bulkhead-agent", version)]
pub struct Args {
    /// Where to listen: `unix:/path/agent.sock` or `tcp:127.0.0.1:PORT`.
    #[arg(long, env = "BULKHEAD_AGENT_LISTEN")]
    pub listen: ListenAddr,

    /// User that requests without an explicit user run as (until `/init` sets another).
    #[arg(long, default_value = "user", env = "BULKHEAD_AGENT_DEFAULT_USER")]
    pub default_user: String,

    /// Most processes started through the API that may run at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_background_processes: u32,

    /// The code-interpreter kernel manifest; when the file exists, port 49999 serves the
    /// code-interpreter API.
    #[arg(
        long,
        default_value = crate::interpreter::manifest::DEFAULT_MANIFEST_PATH,
        env = "BULKHEAD_AGENT_INTERPRETER_MANIFEST"
    )]
    pub interpreter_manifest: std::path::PathBuf,

    /// Also serve the code-interpreter API on these TCP addresses (comma-separated), for code in
    /// the sandbox that calls `localhost:49999` as on E2B. Requests there need no access token:
    /// only the sandbox's own processes can reach the sandbox's loopback. The jail driver passes
    /// `127.0.0.1:49999,[::1]:49999`.
    #[arg(long, value_delimiter = ',', env = "BULKHEAD_AGENT_INTERPRETER_LISTEN")]
    pub interpreter_listen: Vec<SocketAddr>,
    /// Guest mode (the agent is pid 1 of a microVM): build the root file system from the
    /// VM's disks, then serve the host's streams arriving on the virtio-serial port of this
    /// name (see `guest`). Needs `--listen unix:...`, which the streams are connected to.
    #[arg(long, env = "BULKHEAD_AGENT_GUEST_PORT")]
    pub guest_port: Option<String>,

    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or a tracing directive list).
    #[arg(long, default_value = "info", env = "BULKHEAD_AGENT_LOG")]
    pub log_level: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            "unix:/run/a.sock".parse(),
            Ok(ListenAddr::Unix("/run/a.sock".into()))
        );
        assert_eq!(
            "tcp:127.0.0.1:5".parse(),
            Ok(ListenAddr::Tcp("127.0.0.1:5".parse().unwrap()))
        );
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("tcp:localhost".parse::<ListenAddr>().is_err());
        assert!("/run/a.sock".parse::<ListenAddr>().is_err());
    }

    #[test]
    fn defaults() {
        let args = Args::try_parse_from(["bulkhead-agent", "--listen", "tcp:127.0.0.1:1"]).unwrap();
        assert_eq!(args.default_user, "user");
        assert_eq!(args.max_background_processes, 100);
        assert!(
            Args::try_parse_from([
                "bulkhead-agent",
                "--listen",
                "tcp:127.0.0.1:1",
                "--max-background-processes",
                "0"
            ])
            .is_err()
        );
    }
}
