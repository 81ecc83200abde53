//! The engine's volume state: where volumes live on the host (installed once; without it the
//! volume verbs answer "no volume storage") and which ones creates in flight are mounting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::volume::storage::VolumeStorage;

#[derive(Default)]
pub(crate) struct Volumes {
    pub(crate) storage: OnceLock<Arc<dyn VolumeStorage>>,
    /// Volume id → creates mounting it: not deletable meanwhile.
    pub(crate) mounting: Mutex<HashMap<String, usize>>,
}
