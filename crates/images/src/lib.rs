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
//! The root and every `<hash>` directory are owner-only (0700, fixed on caches made by older
//! versions before each build): the trees hold what tenants wrote, set-uid root files included,
//! which must work inside sandboxes (their own `sudo`) and never for another host user.
//!
//! Layered templates (e.g. `code-interpreter-v1` on `base`) are built from a copy of the
//! parent's finished tree: apt, pinned pip/npm installs and files run in a chroot inside a
//! private mount namespace, with the host's CA bundle available for downloads only.
//!
//! `<hash>` is [`TemplateRecipe::content_hash`]: everything that changes the output except the
//! mirror, so a template id or a mirror switch does not force a rebuild. Building needs root
//! (the bootstrap tools create device nodes and chroot), and so does reading the cache (owner-only).
//!
//! Modules, from data to effects (each imports only modules listed before it):
//! `error`, `progress`; `recipe` (what a tree is built from, and its hash: data only) and
//! `interpreter` + `catalog` (the built-in recipes); `fsutil`, `exec` (processes, chroots in a
//! private mount namespace), `mirror`, `finalize`; the image sources `bootstrap` (Debian) and
//! `layer` (build steps on a parent's tree) behind `source::ImageSource`; `entry` (one cache entry and
//! the lock → rootfs.tmp → rootfs → READY protocol every producer follows); `cache`, which
//! runs a source into a content-addressed entry; `oci`, which pulls from OCI registries into
//! cache entries of their own (keyed by manifest digest); and `stack`, which keeps the layers of
//! template builds (a sandbox's exported changes on its parent's tree) in the same cache.

mod bootstrap;
mod cache;
mod catalog;
mod entry;
mod error;
mod exec;
mod finalize;
mod fsutil;
mod gc;
mod interpreter;
mod layer;
mod mirror;
mod nodejs;
pub mod oci;
mod progress;
mod recipe;
mod source;
mod stack;

pub use bootstrap::BootstrapTool;
pub use cache::{CachedImage, DEFAULT_CACHE_ROOT, ImageCache, ImageInfo};
pub use error::{ImageError, ProbeError, Result};
pub use gc::{GcReport, entries_named_in};
pub use interpreter::{
    INTERPRETER_DIR, KERNELS_JSON, TEMPLATE_ID as CODE_INTERPRETER_ID,
    asset_paths as interpreter_asset_paths, kernels_json,
};
pub use layer::HOST_CA_BUNDLE;
pub use mirror::{DEFAULT_MIRROR, host_mirror};
pub use progress::{
    Activity, IndicatifProgress, LogProgress, PackageStep, Progress, auto_progress, parse_activity,
};
pub use recipe::{BuildStep, FileAsset, TemplateRecipe};
pub use stack::{LayerInfo, LayerStore};
