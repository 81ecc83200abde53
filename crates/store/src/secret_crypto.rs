//! Encryption at rest for secret values: XChaCha20-Poly1305 under a 256-bit key the operator
//! provides (`--secrets-key-file`) or that the first start generates into `<data-dir>/secrets.key`
//! (outside the database, so a copy of the database alone reveals no value). Each value gets a
//! random 192-bit nonce, and the associated data binds it to its team and secret id: a sealed
//! value copied into another team's (or another secret's) row does not decrypt.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use chacha20poly1305::aead::{Aead, Generate, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};

/// The key file the server generates when the operator gives none.
pub const DEFAULT_KEY_FILE: &str = "secrets.key";

const NONCE_LEN: usize = 24;
/// Versioned domain of the associated data; a new format gets a new label.
const AAD_LABEL: &[u8] = b"bulkhead-secret-v1";
const CHECK_AAD: &[u8] = b"bulkhead-secrets-key-check-v1";
const CHECK_TEXT: &[u8] = b"bulkhead secrets key check";

/// What can go wrong with the secrets key or a sealed value.
#[derive(Debug, thiserror::Error)]
pub enum SecretCryptoError {
    /// The key file could not be read.
    #[error(
        "Cannot read the secrets key file {}: check the path and permissions (`--secrets-key-file` / BULKHEAD_SECRETS_KEY_FILE)",
        path.display()
    )]
    ReadKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The key file holds something other than a 256-bit key.
    #[error(
        "The secrets key file {} does not hold a 256-bit key: it must contain 64 hex characters (create one with `openssl rand -hex 32`)",
        path.display()
    )]
    KeyFormat { path: PathBuf },
    /// A new key file could not be written.
    #[error(
        "Cannot create the secrets key file {}: check that the data directory is writable, or pass `--secrets-key-file`",
        path.display()
    )]
    WriteKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A sealed value failed to decrypt: another key, or a row altered or moved.
    #[error("The value does not decrypt with this secrets key (wrong key, or the row was altered)")]
    Decrypt,
    /// The random number generator failed (the nonce could not be drawn).
    #[error("The operating system's random number generator failed")]
    Random,
}

type Result<T, E = SecretCryptoError> = std::result::Result<T, E>;

/// A 256-bit secrets key. Wiped from memory when dropped; never printed.
#[derive(Clone)]
pub struct SecretsKey(Key);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(<redacted>)")
    }
}

impl Drop for SecretsKey {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.0.as_mut_slice().zeroize();
    }
}

impl SecretsKey {
    /// A fresh random key.
    pub fn generate() -> Result<Self> {
        Key::try_generate()
            .map(SecretsKey)
            .map_err(|_| SecretCryptoError::Random)
    }

    /// Parses 64 hex characters (surrounding whitespace, such as a trailing newline, ignored).
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut key = Key::default();
        hex::decode_to_slice(text.trim(), &mut key).ok()?;
        Some(SecretsKey(key))
    }

    fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Reads the operator's key file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretCryptoError::ReadKey {
            path: path.to_owned(),
            source,
        })?;
        let key = Self::from_hex(&text).ok_or_else(|| SecretCryptoError::KeyFormat {
            path: path.to_owned(),
        })?;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                path = %path.display(),
                "the secrets key file is readable by other users: chmod 600 it"
            );
        }
        Ok(key)
    }

    /// Reads `path`, or when it does not exist, generates a key into it: mode 0600, written to
    /// a temporary file and linked into place, so a reader never sees a partial key and two
    /// servers starting at once end up with the same one. Returns the key and whether it is new.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool)> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => return Self::load(path).map(|k| (k, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SecretCryptoError::ReadKey {
                    path: path.to_owned(),
                    source,
                });
            }
        }
        let key = Self::generate()?;
        let write_err = |source| SecretCryptoError::WriteKey {
            path: path.to_owned(),
            source,
        };
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(format!("{}\n", key.to_hex()).as_bytes())?;
            f.sync_all()?;
            std::fs::hard_link(&tmp, path)
        })();
        let _ = std::fs::remove_file(&tmp);
        match written {
            Ok(()) => {
                if let Some(dir) = path.parent().and_then(|d| std::fs::File::open(d).ok()) {
                    let _ = dir.sync_all();
                }
                Ok((key, true))
            }
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Self::load(path).map(|k| (k, false))
            }
            Err(e) => Err(write_err(e)),
        }
    }
}

/// Seals and opens secret values with one key.
pub struct SecretCipher {
    aead: XChaCha20Poly1305,
}

impl std::fmt::Debug for SecretCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretCipher(<redacted>)")
    }
}

/// `label ‖ 0 ‖ team ‖ 0 ‖ id`: team ids and secret ids never contain NUL, so the encoding is
/// unambiguous.
fn value_aad(team_id: &str, secret_id: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_LABEL.len() + team_id.len() + secret_id.len() + 2);
    aad.extend_from_slice(AAD_LABEL);
    aad.push(0);
    aad.extend_from_slice(team_id.as_bytes());
    aad.push(0);
    aad.extend_from_slice(secret_id.as_bytes());
    aad
}

impl SecretCipher {
    pub fn new(key: &SecretsKey) -> Self {
        SecretCipher {
            aead: XChaCha20Poly1305::new(&key.0),
        }
    }

    fn seal_bytes(&self, plaintext: &[u8], aad: &[u8]) -> Result<String> {
        let nonce = XNonce::try_generate().map_err(|_| SecretCryptoError::Random)?;
        let ct = self
            .aead
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            // Only fails for messages beyond the cipher's limit (far over our value cap).
            .map_err(|_| SecretCryptoError::Decrypt)?;
        let mut out = Vec::with_capacity(NONCE_LEN + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        Ok(B64.encode(out))
    }

    fn open_bytes(&self, sealed: &str, aad: &[u8]) -> Result<Vec<u8>> {
        let raw = B64.decode(sealed).map_err(|_| SecretCryptoError::Decrypt)?;
        if raw.len() < NONCE_LEN {
            return Err(SecretCryptoError::Decrypt);
        }
        let (nonce, ct) = raw.split_at(NONCE_LEN);
        let nonce = XNonce::try_from(nonce).map_err(|_| SecretCryptoError::Decrypt)?;
        self.aead
            .decrypt(&nonce, Payload { msg: ct, aad })
            .map_err(|_| SecretCryptoError::Decrypt)
    }

    /// Encrypts `value` for the secret `secret_id` of team `team_id`.
    pub fn seal(&self, team_id: &str, secret_id: &str, value: &str) -> Result<String> {
        self.seal_bytes(value.as_bytes(), &value_aad(team_id, secret_id))
    }

    /// Decrypts what [`seal`](Self::seal) produced for the same team and secret id.
    pub fn open(&self, team_id: &str, secret_id: &str, sealed: &str) -> Result<String> {
        let plain = self.open_bytes(sealed, &value_aad(team_id, secret_id))?;
        String::from_utf8(plain).map_err(|_| SecretCryptoError::Decrypt)
    }

    /// The known text sealed with this key, stored so a later start can tell a wrong key.
    pub fn key_check(&self) -> Result<String> {
        self.seal_bytes(CHECK_TEXT, CHECK_AAD)
    }

    /// Whether `sealed` is [`key_check`](Self::key_check)'s output under this very key.
    pub fn matches_key_check(&self, sealed: &str) -> bool {
        self.open_bytes(sealed, CHECK_AAD)
            .is_ok_and(|p| p == CHECK_TEXT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cipher() -> SecretCipher {
        SecretCipher::new(&SecretsKey::generate().unwrap())
    }

    #[test]
    fn round_trip_with_fresh_nonces() {
        let c = cipher();
        let a = c.seal("team-a", "sec_1", "sk-VALUE").unwrap();
        let b = c.seal("team-a", "sec_1", "sk-VALUE").unwrap();
        assert_ne!(a, b, "every seal draws a new nonce");
        assert!(!a.contains("sk-VALUE"));
        assert_eq!(c.open("team-a", "sec_1", &a).unwrap(), "sk-VALUE");
        assert_eq!(c.open("team-a", "sec_1", &b).unwrap(), "sk-VALUE");
        assert_eq!(
            c.open("t", "s", &c.seal("t", "s", "").unwrap()).unwrap(),
            ""
        );
    }

    #[test]
    fn associated_data_binds_team_and_id() {
        let c = cipher();
        let sealed = c.seal("team-a", "sec_1", "v").unwrap();
        // Copied into another team's row, or another secret's row, it does not decrypt.
        assert!(matches!(
            c.open("team-b", "sec_1", &sealed),
            Err(SecretCryptoError::Decrypt)
        ));
        assert!(matches!(
            c.open("team-a", "sec_2", &sealed),
            Err(SecretCryptoError::Decrypt)
        ));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        let s = c.seal("ab", "c", "v").unwrap();
        assert!(c.open("a", "bc", &s).is_err());
    }

    #[test]
    fn wrong_key_and_tampering_fail() {
        let c = cipher();
        let other = cipher();
        let sealed = c.seal("t", "s", "value").unwrap();
        assert!(other.open("t", "s", &sealed).is_err());
        let mut raw = B64.decode(&sealed).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        assert!(c.open("t", "s", &B64.encode(&raw)).is_err());
        assert!(c.open("t", "s", "not base64!").is_err());
        assert!(c.open("t", "s", "AAAA").is_err());
        assert!(c.matches_key_check(&c.key_check().unwrap()));
        assert!(!other.matches_key_check(&c.key_check().unwrap()));
    }

    #[test]
    fn key_file_is_created_once_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DEFAULT_KEY_FILE);
        let (k1, created) = SecretsKey::load_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (k2, created) = SecretsKey::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(k1.to_hex(), k2.to_hex());
        // Only the key file is left behind (no temporary file).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let c1 = SecretCipher::new(&k1);
        assert_eq!(
            SecretCipher::new(&k2)
                .open("t", "s", &c1.seal("t", "s", "v").unwrap())
                .unwrap(),
            "v"
        );
    }

    #[test]
    fn key_file_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        assert!(SecretsKey::load(&path).is_ok());
        for bad in [
            "",
            "abcd",
            &"zz".repeat(32),
            &"ab".repeat(33),
            "é".repeat(64).as_str(),
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(
                matches!(
                    SecretsKey::load(&path),
                    Err(SecretCryptoError::KeyFormat { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            SecretsKey::load(&dir.path().join("missing")),
            Err(SecretCryptoError::ReadKey { .. })
        ));
        assert_eq!(
            format!("{:?}", SecretsKey::from_hex(&"ab".repeat(32)).unwrap()),
            "SecretsKey(<redacted>)"
        );
    }
}
