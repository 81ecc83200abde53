//! The host's side of the agent's socket directory, which the sandbox can write: connecting
//! without following planted symlinks, and reading the agent's log tail without blocking on a
//! planted FIFO. Leaf module.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::sys;

/// Connect to the agent's socket without following symlinks. The socket directory is writable
/// by the sandbox, which could otherwise swap `agent.sock` for a symlink to a host socket and
/// have the server connect there. The socket is opened `O_PATH|O_NOFOLLOW`, checked to be a
/// socket, and connected through its `/proc/self/fd` link, which names that very inode.
pub(super) async fn connect_agent(sock: &Path) -> io::Result<tokio::net::UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = sys::cpath(sock)?;
    // SAFETY: valid C string; the returned descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = fs::File::from(fd);
    if !file.metadata()?.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a socket", sock.display()),
        ));
    }
    tokio::net::UnixStream::connect(format!("/proc/self/fd/{}", file.as_raw_fd())).await
}

/// The last few lines the agent wrote (empty if none), for start errors (never following a
/// symlink the sandbox may have planted, never blocking on a FIFO).
pub(super) fn log_tail(path: &Path) -> String {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return String::new();
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return String::new();
    }
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(2048)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_ignores_symlinks_and_fifos() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        fs::write(&secret, "host secret").unwrap();
        let log = t.path().join("agent.log");
        std::os::unix::fs::symlink(&secret, &log).unwrap();
        assert_eq!(log_tail(&log), "");
        fs::remove_file(&log).unwrap();
        let c = sys::cpath(&log).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(log_tail(&log), "");
        fs::remove_file(&log).unwrap();
        fs::write(&log, "line 1\nboom\n").unwrap();
        assert_eq!(log_tail(&log), "line 1\nboom");
    }

    #[tokio::test]
    async fn agent_connections_refuse_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real.sock");
        let listener = tokio::net::UnixListener::bind(&real).unwrap();
        connect_agent(&real).await.unwrap();
        let (_conn, _) = listener.accept().await.unwrap();
        let link = t.path().join("agent.sock");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // O_PATH|O_NOFOLLOW opens the link itself, which is not a socket.
        let e = connect_agent(&link).await.unwrap_err();
        assert!(e.to_string().contains("is not a socket"), "{e}");
        let file = t.path().join("plain");
        fs::write(&file, "").unwrap();
        assert!(connect_agent(&file).await.is_err());
    }
}
