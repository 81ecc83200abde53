//! Template root filesystems: Debian trees built with mmdebstrap (or debootstrap), then
//! finalised for sandboxes, content-hashed and cached.
//!
//! Layout of a cache root (default `/var/cache/bulkhead/images`):
//!
//! ```text
//! <root>/<hash>/lock          flock(2)ed while building, so concurrent builds of one hash queue
//! <root>/<hash>/rootfs.tmp    the tree being built (removed if a build dies half-way)
//! <root>/<hash>/rootfs        the finished tree, renamed into place atomically
//! <root>/<hash>/READY         build metadata (JSON), written last: its presence means "usable"
//! ```
//!
//! Layered templates (e.g. `code-interpreter-v1` on `base`) are built from a copy of the
//! parent's finished tree: apt, pinned pip/npm installs and files run in a chroot inside a
//! private mount namespace, with the host's CA bundle available for downloads only.
//!
//! `<hash>` is [`TemplateRecipe::content_hash`]: everything that changes the output except the
//! mirror, so a template id or a mirror switch does not force a rebuild. Building needs root
//! (the bootstrap tools create device nodes and chroot); reading the cache does not.

mod bootstrap;
mod cache;
mod finalize;
mod fsutil;
mod interpreter;
mod layer;
mod progress;
mod recipe;

use std::path::PathBuf;

pub use bootstrap::{BootstrapTool, DEFAULT_MIRROR, host_mirror};
pub use cache::{CachedImage, ImageCache, ImageInfo};
pub use interpreter::{
    INTERPRETER_DIR, KERNELS_JSON, TEMPLATE_ID as CODE_INTERPRETER_ID,
    asset_paths as interpreter_asset_paths, kernels_json,
};
pub use layer::{BuildStep, FileAsset, HOST_CA_BUNDLE};
pub use progress::{
    Activity, IndicatifProgress, LogProgress, PackageStep, Progress, auto_progress, parse_activity,
};
pub use recipe::TemplateRecipe;

/// Default cache root for template root filesystems.
pub const DEFAULT_CACHE_ROOT: &str = "/var/cache/bulkhead/images";

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
    MirrorUnreachable { mirror: String, reason: String },
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
