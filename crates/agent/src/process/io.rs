//! Process input and output plumbing: stdin pipes and pseudo-terminals.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use nix::fcntl::OFlag;
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::process::ChildStdin;

/// Errors writing input to a process or resizing its terminal.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The process has a PTY; stdin input must go to the PTY.
    #[error(
        "Process {0} runs in a PTY: send input as `pty` (e.g. `sandbox.pty.send_stdin`), not as `stdin`"
    )]
    IsPty(u32),
    /// The process has no PTY.
    #[error(
        "Process {0} was not started with a PTY: send input as `stdin`, and only PTY processes can be resized"
    )]
    NotPty(u32),
    /// Stdin was not enabled at start or has been closed.
    #[error(
        "Stdin of process {0} is not open: start the command with `stdin=True` to send input, and do not close it before you are done"
    )]
    StdinClosed(u32),
    /// A PTY process's stdin cannot be closed.
    #[error(
        "Cannot close stdin of process {0} because it runs in a PTY: send Ctrl-D (\\x04) instead"
    )]
    CloseOnPty(u32),
    /// Writing failed (the process probably exited or closed its input).
    #[error("Writing input to process {pid} failed")]
    Write {
        /// Process id.
        pid: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Resizing the terminal failed.
    #[error("Resizing the terminal of process {pid} failed")]
    Resize {
        /// Process id.
        pid: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// Where a process's input goes.
pub enum ProcessInput {
    /// Stdin is `/dev/null`.
    None,
    /// Stdin is a pipe; `None` once closed.
    Pipe(tokio::sync::Mutex<Option<ChildStdin>>),
    /// The process runs in a PTY.
    Pty(std::sync::Arc<PtyMaster>),
}

impl ProcessInput {
    /// Writes stdin bytes.
    pub async fn write_stdin(&self, pid: u32, data: &[u8]) -> Result<(), InputError> {
        match self {
            ProcessInput::None => Err(InputError::StdinClosed(pid)),
            ProcessInput::Pty(_) => Err(InputError::IsPty(pid)),
            ProcessInput::Pipe(pipe) => {
                let mut guard = pipe.lock().await;
                let stdin = guard.as_mut().ok_or(InputError::StdinClosed(pid))?;
                stdin
                    .write_all(data)
                    .await
                    .map_err(|source| InputError::Write { pid, source })?;
                stdin
                    .flush()
                    .await
                    .map_err(|source| InputError::Write { pid, source })
            }
        }
    }

    /// Writes bytes to the PTY.
    pub async fn write_pty(&self, pid: u32, data: &[u8]) -> Result<(), InputError> {
        match self {
            ProcessInput::Pty(pty) => pty
                .write_all(data)
                .await
                .map_err(|source| InputError::Write { pid, source }),
            _ => Err(InputError::NotPty(pid)),
        }
    }

    /// Closes the stdin pipe (idempotent).
    pub async fn close_stdin(&self, pid: u32) -> Result<(), InputError> {
        match self {
            ProcessInput::None => Ok(()),
            ProcessInput::Pty(_) => Err(InputError::CloseOnPty(pid)),
            ProcessInput::Pipe(pipe) => {
                if let Some(mut stdin) = pipe.lock().await.take() {
                    let _ = stdin.shutdown().await;
                }
                Ok(())
            }
        }
    }

    /// Resizes the PTY.
    pub fn resize(&self, pid: u32, cols: u16, rows: u16) -> Result<(), InputError> {
        match self {
            ProcessInput::Pty(pty) => pty
                .resize(cols, rows)
                .map_err(|source| InputError::Resize { pid, source }),
            _ => Err(InputError::NotPty(pid)),
        }
    }
}

/// The master side of a pseudo-terminal, non-blocking and driven by tokio.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

impl PtyMaster {
    /// Opens a PTY pair with the given window size. Both descriptors are close-on-exec from the
    /// start, so a process spawned concurrently never inherits them (an inherited slave would
    /// keep the terminal open after the real process exits).
    pub fn open(cols: u16, rows: u16) -> io::Result<(Self, OwnedFd)> {
        let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
        nix::pty::grantpt(&master)?;
        nix::pty::unlockpt(&master)?;
        let slave_path = nix::pty::ptsname_r(&master)?;
        // SAFETY: into_raw_fd transfers ownership of a valid, open descriptor to the OwnedFd.
        let master = unsafe { OwnedFd::from_raw_fd(master.into_raw_fd()) };
        let slave = nix::fcntl::open(
            slave_path.as_str(),
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        set_window_size(master.as_raw_fd(), cols, rows)?;
        let flags = nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_GETFL)?;
        nix::fcntl::fcntl(
            &master,
            nix::fcntl::FcntlArg::F_SETFL(OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK),
        )?;
        // SAFETY: `master` owns a valid descriptor that is neither replaced nor closed while the
        // AsyncFd owns it.
        let fd = unsafe { AsyncFd::register(master)? };
        Ok((Self { fd }, slave))
    }

    /// Reads output; `Ok(0)` once every slave descriptor is closed (the kernel reports `EIO`).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let result = guard.try_io(|fd| {
                // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the fd is open.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n.cast_unsigned())
                }
            });
            match result {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }

    /// Writes all of `data` (typed input).
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            let result = guard.try_io(|fd| {
                // SAFETY: `data` is valid for reads of `data.len()` bytes; the fd is open.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n.cast_unsigned())
                }
            });
            match result {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Sets the window size (the kernel sends `SIGWINCH` to the foreground process group).
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        set_window_size(self.fd.get_ref().as_raw_fd(), cols, rows)
    }
}

fn set_window_size(fd: i32, cols: u16, rows: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a `winsize` from the valid pointer; fd is a PTY master.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &raw const size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
