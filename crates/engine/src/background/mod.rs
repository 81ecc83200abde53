//! Work the engine does on its own: recovery after a restart, the reaper (TTLs, retention), the
//! meter (usage and credits) and the image cache's garbage collection.

pub(crate) mod image_gc;
pub(crate) mod meter;
pub(crate) mod reaper;
pub(crate) mod recovery;
