//! Identifiers and secrets. Sandbox ids follow E2B's shape (20 chars of `[a-z0-9]`), which the
//! SDKs and E2B's host parser (`{port}-{id}.{domain}`) expect.

use rand::Rng;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

pub fn sandbox_id() -> String {
    let mut rng = rand::rng();
    (0..20)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A template id: E2B's shape (20 chars of `[a-z0-9]`), like sandbox ids.
pub fn template_id() -> String {
    sandbox_id()
}

/// A build id: E2B's SDKs parse it as a UUID.
pub fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Random lowercase hex string of `bytes` random bytes.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill(&mut buf[..]);
    hex::encode(buf)
}

/// Is `id` a well-formed sandbox id? Legacy `<id>-<clientID>` forms are accepted by
/// [`normalize_sandbox_id`] first.
pub fn is_valid_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Old SDKs address sandboxes as `<sandboxID>-<clientID>`; strip the suffix like E2B does.
pub fn normalize_sandbox_id(id: &str) -> &str {
    id.split('-').next().unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_have_e2b_shape() {
        for _ in 0..100 {
            let id = sandbox_id();
            assert_eq!(id.len(), 20);
            assert!(is_valid_sandbox_id(&id));
        }
        assert!(!is_valid_sandbox_id("../etc"));
        assert!(!is_valid_sandbox_id("ABC"));
        assert!(!is_valid_sandbox_id(""));
    }

    #[test]
    fn legacy_ids_are_normalized() {
        assert_eq!(normalize_sandbox_id("abc123-bulkhead"), "abc123");
        assert_eq!(normalize_sandbox_id("abc123"), "abc123");
    }
}
