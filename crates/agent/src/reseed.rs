//! Re-seeding a VM clone (the microvm driver's `POST /bulkhead/cloned` body): every clone of a
//! template snapshot resumes with the same kernel RNG state and the wall clock of the moment the
//! snapshot was taken. The host sends fresh randomness, which goes into the kernel's input pool
//! (`RNDADDENTROPY`) followed by an immediate reseed of the CRNG (`RNDRESEEDCRNG`), so
//! `getrandom`, `/dev/urandom` and `/proc/sys/kernel/random/uuid` diverge at once; and its
//! clock, which becomes `CLOCK_REALTIME`. Both need root in the guest (the agent is pid 1).
//! The request also carries the sandbox's process limit (the clone's, not the template's; see
//! [`crate::guest_limits`]).

use bulkhead_envd::protocol::ClonedRequest;

#[derive(Debug, thiserror::Error)]
pub enum ReseedError {
    #[error("the entropy is not hex: send an even number of hex digits")]
    BadEntropy,
    #[error("cannot add the host's entropy to the kernel's pool")]
    AddEntropy(#[source] std::io::Error),
    #[error("cannot reseed the kernel's random number generator")]
    Reseed(#[source] std::io::Error),
    #[error("cannot set the clock")]
    Clock(#[source] std::io::Error),
    #[error("cannot set the sandbox's process limit (pids.max of its cgroup)")]
    PidsMax(#[source] std::io::Error),
}

/// `_IOW('R', 0x03, int[2])` and `_IO('R', 0x07)` from `<linux/random.h>`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Applies what the request carries; a request without fields changes nothing.
pub fn apply(request: &ClonedRequest) -> Result<(), ReseedError> {
    if let Some(hex) = &request.entropy {
        let bytes = decode_hex(hex).ok_or(ReseedError::BadEntropy)?;
        add_entropy(&bytes)?;
    }
    if let Some(limit) = request.pids_max {
        crate::guest_limits::set_pids_max(limit).map_err(ReseedError::PidsMax)?;
    }
    if let Some(ns) = request.clock_unix_ns {
        let ts = libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: a valid timespec.
        if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
            return Err(ReseedError::Clock(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn add_entropy(bytes: &[u8]) -> Result<(), ReseedError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(ReseedError::AddEntropy)?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + bytes.len());
    info.extend_from_slice(&((bytes.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(bytes.len() as i32).to_ne_bytes());
    info.extend_from_slice(bytes);
    // Padding to whole u32 words, as the struct's flexible array is declared.
    info.resize(info.len().div_ceil(4) * 4, 0);
    // SAFETY: the buffer is a complete rand_pool_info that outlives the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) } != 0 {
        return Err(ReseedError::AddEntropy(std::io::Error::last_os_error()));
    }
    // SAFETY: an argument-less ioctl on an open /dev/urandom.
    if unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG) } != 0 {
        return Err(ReseedError::Reseed(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_decodes_and_rejects_garbage() {
        assert_eq!(decode_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
        assert!(matches!(
            apply(&ClonedRequest {
                entropy: Some("xyz".into()),
                clock_unix_ns: None,
                pids_max: None,
            }),
            Err(ReseedError::BadEntropy)
        ));
    }

    #[test]
    fn an_empty_request_changes_nothing() {
        apply(&ClonedRequest::default()).unwrap();
    }
}
