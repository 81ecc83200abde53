//! What can go wrong pulling an image from an OCI registry, each with what to do about it.

use std::path::PathBuf;

/// The flags and environment variables an operator sets to reach registries; quoted in
/// errors so the fix is in the message.
pub(crate) const CONFIGURE_HINT: &str = "check the image name; operators: the server log says \
     why, and a registry can be pointed at a reachable mirror with `bulkhead serve \
     --registry-mirror docker.io=https://mirror.example` (env BULKHEAD_REGISTRY_MIRRORS)";

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("Invalid image reference {reference:?}: {reason}")]
    BadReference { reference: String, reason: String },
    #[error(
        "Pulling from registry {registry} is not allowed on this server (allowed: {allowed}): \
         ask the operator to add it with --registry-allow, or use an image from an allowed \
         registry"
    )]
    NotAllowed { registry: String, allowed: String },
    /// Every transport failure (refused, timeout, reset, TLS, DNS) and every connection the
    /// pull's rules refused (a private address, plain HTTP, a redirect elsewhere): one message,
    /// so a pull cannot be used to learn what listens where. The detail is logged at info.
    #[error("Could not pull image {reference} from registry {registry}: {hint}")]
    Unreachable {
        reference: String,
        registry: String,
        hint: &'static str,
    },
    #[error("Invalid registry settings: {0}")]
    Config(String),
    /// A `--registry-allow` / `--registry-insecure` entry (named by `flag`) does not parse.
    #[error("Invalid registry settings: {flag} {source}")]
    Pattern {
        flag: &'static str,
        #[source]
        source: super::policy::HostPatternError,
    },
    #[error(
        "The registry {endpoint} refused the credentials for {reference} ({reason}): check the \
         username and password (or the operator's --registry-auth-file entry for it)"
    )]
    Auth {
        reference: String,
        endpoint: String,
        reason: String,
    },
    #[error("Image {reference} was not found in {endpoint}: check the name and tag ({reason})")]
    NotFound {
        reference: String,
        endpoint: String,
        reason: String,
    },
    #[error("Pulling {reference} from {endpoint} failed: {reason}")]
    Registry {
        reference: String,
        endpoint: String,
        reason: String,
    },
    #[error(
        "Image {reference} has no variant for this host's platform ({platform}); pick an image \
         built for it"
    )]
    NoPlatform { reference: String, platform: String },
    #[error("Image {reference} is not usable: {reason}")]
    BadImage { reference: String, reason: String },
    #[error(
        "Layer {layer} uses the unsupported media type {media_type}: only tar, tar+gzip and \
         tar+zstd layers can be unpacked"
    )]
    MediaType { layer: String, media_type: String },
    #[error(
        "The image is too large: more than {limit} {what}; ask the operator to raise the pull \
         limits (--registry-max-bytes) or use a smaller image"
    )]
    TooLarge { what: &'static str, limit: u64 },
    #[error(
        "Layer {layer} tries to write outside the image ({path:?} is {why}): refusing the image"
    )]
    Escape {
        layer: String,
        path: String,
        why: &'static str,
    },
    #[error("Layer {layer} is invalid: {reason}")]
    Layer { layer: String, reason: String },
    #[error(
        "Layer {layer}'s content does not match its digest in the image config (expected \
         {expected}, got {actual}): the registry served corrupt or tampered data"
    )]
    DiffId {
        layer: String,
        expected: String,
        actual: String,
    },
    #[error("Cannot read the registry credentials file {path}: {reason}")]
    AuthFile { path: PathBuf, reason: String },
    /// Cache, locking and file-system errors shared with the other image sources.
    #[error(transparent)]
    Image(Box<crate::error::ImageError>),
    #[error("Cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl OciError {
    pub(crate) fn layer(layer: &str, reason: impl Into<String>) -> OciError {
        OciError::Layer {
            layer: layer.to_owned(),
            reason: reason.into(),
        }
    }
}
