//! Volumes: persistent directories mounted into sandboxes. `verbs` the API, `types` names and
//! mounts, `storage` where they live on the host, `fs` their files (read and written from the
//! host, safely), `content` who may read them.

pub(crate) mod content;
pub mod fs;
pub(crate) mod state;
pub mod storage;
pub(crate) mod types;
pub(crate) mod verbs;
