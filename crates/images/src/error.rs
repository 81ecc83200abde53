//! The crate's error: what went wrong building or reading a template image, and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("Invalid template recipe: {0}")]
    InvalidRecipe(String),
    #[error(
        "Building template images needs root (debootstrap/mmdebstrap create device nodes and \
         chroot): run the build as root, or pre-build the cache at {cache} as root"
    )]
    NotRoot { cache: PathBuf },
    #[error(
        "No bootstrap tool (mmdebstrap or debootstrap) is installed: run `{install_command}` \
         (or allow Bulkhead to install missing tools)"
    )]
    ToolMissing { install_command: String },
    #[error(
        "Installing the bootstrap tool with `{command}` failed ({status}); last output:\n{tail}"
    )]
    ToolInstall {
        command: String,
        status: String,
        tail: String,
    },
    #[error(
        "Cannot reach the Debian mirror {mirror} ({reason}): check the network or proxy, or \
         configure a reachable mirror (URIs: in /etc/apt/sources.list.d/debian.sources)"
    )]
    MirrorUnreachable {
        mirror: String,
        /// Not a `#[source]`: the message already carries it, in the middle.
        reason: ProbeError,
    },
    #[error("{tool} failed ({status}) building suite {suite}; last output:\n{tail}")]
    Bootstrap {
        tool: String,
        suite: String,
        status: String,
        tail: String,
    },
    #[error("`{command}` failed inside the new root filesystem ({status}); last output:\n{tail}")]
    Chroot {
        command: String,
        status: String,
        tail: String,
    },
    #[error(
        "Copying {from} to {to} failed ({status}); check free space in the image cache; last \
         output:\n{tail}"
    )]
    Copy {
        from: PathBuf,
        to: PathBuf,
        status: String,
        tail: String,
    },
    #[error("Cannot read the extra CA bundle {path}: check the path in the template settings")]
    CaBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "Refusing to delete {path}: a filesystem is still mounted below it; unmount it \
         (`umount -R {path}`) and retry"
    )]
    StillMounted { path: PathBuf },
    #[error("Cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Cannot start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
}

impl ImageError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ImageError {
        let path = path.into();
        move |source| ImageError::Io {
            action,
            path,
            source,
        }
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// Why a Debian mirror did not answer the probe (see `mirror`); the text is the `reason` of
/// [`ImageError::MirrorUnreachable`].
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no answer within 15 s")]
    Timeout,
    #[error("{0:?} is not a URL")]
    NotAUrl(String),
    #[error("{} does not exist", .0.display())]
    NoSuite(std::path::PathBuf),
    #[error("unsupported URL scheme {0:?}")]
    Scheme(String),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot send a request to {addr}: {source}")]
    Send {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no HTTP answer from {addr}: {source}")]
    NoAnswer {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not an HTTP answer from {addr}: {line:?}")]
    NotHttp { addr: String, line: String },
    #[error("suite {suite} not found (HTTP 404 for {path})")]
    SuiteNotFound { suite: String, path: String },
    #[error("HTTP {status} for {path}")]
    Status { status: u16, path: String },
}
