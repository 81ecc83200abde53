//! Signed `/files` URLs: which sandbox's access token signed a download or upload URL.

use bulkhead_envd::rest::{FileOperation, file_signature};

use crate::engine::Engine;
use crate::tenancy::keys;

impl Engine {
    /// Find the sandbox whose access token produced a signed `/files` URL (download/upload URLs
    /// carry no sandbox id when the SDK uses one sandbox URL for everything).
    pub fn find_by_file_signature(
        &self,
        path: &str,
        operation: FileOperation,
        username: &str,
        signature: &str,
        expiration: Option<i64>,
    ) -> Option<String> {
        let live = self.live.lock();
        live.iter().find_map(|(id, l)| {
            let token = l.access_token.as_deref()?;
            let expected = file_signature(path, operation, username, token, expiration);
            keys::constant_time_eq(&expected, signature).then(|| id.clone())
        })
    }
}
