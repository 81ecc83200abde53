//! A downloaded layer blob as the uncompressed tar it carries (gzip, zstd or plain, by media
//! type), hashed on the way so the result can be checked against the config's `diff_ids`.

use std::fs::File;
use std::io::{self, BufReader, Read};

use sha2::{Digest, Sha256};

use super::error::OciError;

/// The tar stream inside a layer blob.
pub(crate) fn decoder(
    file: File,
    media_type: &str,
    layer: &str,
) -> Result<Box<dyn Read>, OciError> {
    let input = BufReader::new(file);
    let mt = media_type.to_ascii_lowercase();
    if mt.ends_with("tar+gzip") || mt.ends_with(".tar.gzip") || mt.ends_with("tar.gzip") {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(input)))
    } else if mt.ends_with("tar+zstd") {
        let d = ruzstd::decoding::StreamingDecoder::new(input)
            .map_err(|e| OciError::layer(layer, format!("not a zstd stream: {e}")))?;
        Ok(Box::new(d))
    } else if mt.ends_with(".tar") || mt.ends_with("diff.tar") {
        Ok(Box::new(input))
    } else {
        Err(OciError::MediaType {
            layer: layer.to_owned(),
            media_type: media_type.to_owned(),
        })
    }
}

/// Passes bytes through and hashes them, failing past `cap` bytes: a small blob that
/// decompresses to an endless stream (a "zip bomb", even after the tar's end) stops there.
pub(crate) struct Hashing<R> {
    inner: R,
    hash: Sha256,
    left: u64,
    /// Set when the cap was hit, so the caller reports the limit rather than a tar error.
    pub exceeded: bool,
}

impl<R: Read> Hashing<R> {
    pub fn new(inner: R, cap: u64) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            left: cap,
            exceeded: false,
        }
    }

    /// Reads what the tar reader left (end-of-archive blocks, padding) and returns
    /// `sha256:<hex>` of the whole stream.
    pub fn finish(&mut self) -> io::Result<String> {
        io::copy(self, &mut io::sink())?;
        Ok(format!(
            "sha256:{}",
            hex::encode(self.hash.finalize_reset())
        ))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.exceeded = true;
            return Err(io::Error::other("the layer is larger than the pull limit"));
        }
        self.left -= n as u64;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
