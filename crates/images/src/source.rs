//! Image sources: where a template's tree comes from. Every source produces a complete tree in
//! a directory that does not exist yet; the cache around it handles locking, syncing, the
//! atomic rename and `READY`. Today there are two (a Debian bootstrap, and a layer of build
//! steps on a parent template); an OCI pull is the next one, added as a variant here.

use std::path::Path;

use crate::bootstrap::DebianBootstrap;
use crate::error::Result;
use crate::layer::LayerBuild;
use crate::progress::Progress;

pub(crate) enum ImageSource<'a> {
    /// A fresh Debian tree (mmdebstrap or debootstrap), finalised for sandboxes.
    Debian(DebianBootstrap<'a>),
    /// A copy of the parent template's tree with the recipe's packages and steps run in it.
    Layer(LayerBuild<'a>),
}

impl ImageSource<'_> {
    /// Produces the tree at `target`, which must not exist. Returns what built it (recorded as
    /// the `tool` of the cache entry).
    pub async fn produce(&self, target: &Path, progress: &dyn Progress) -> Result<String> {
        match self {
            ImageSource::Debian(s) => s.produce(target, progress).await,
            ImageSource::Layer(s) => s.produce(target, progress).await,
        }
    }
}
