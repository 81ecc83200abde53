//! The zygote: a long-lived launcher that forks a copy of itself per request instead of the
//! driver executing the launcher (the whole server binary) for every sandbox. Profiling showed
//! the `execve`, dynamic linking, page faults and teardown of that short-lived process, plus
//! compiling the seccomp policy, as the largest single CPU cost of a start; a fork of the small,
//! idle zygote costs a fraction of it.
//!
//! Protocol: the zygote's stdin is one end of a `SOCK_SEQPACKET` socket pair. Each message is
//! one JSON [`crate::spec::LaunchRequest`] carrying one descriptor (`SCM_RIGHTS`): the write
//! end of the pipe its reply goes to. The zygote forks; the child (single-threaded, like a
//! freshly executed launcher) makes that pipe its stdout and runs the one-request launcher
//! ([`crate::launcher`]), so a sandbox init it clones is re-parented to the server (the
//! nearest child subreaper) when the child exits, exactly as with an executed launcher. The
//! zygote exits when the server's end closes (the server stopped or died), so it never outlives
//! the server; sandboxes do, as before.
//!
//! What a forked request handler inherits from the zygote is only what a freshly executed
//! launcher would have: the environment is empty (the driver clears it), the only open
//! descriptors are stdio and the request socket (which the sandbox init closes before exec
//! with everything else above stderr), and the memory is the zygote's idle state plus the
//! compiled seccomp policy.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The launcher argument that makes it a zygote.
pub const ZYGOTE_FLAG: &str = "--zygote";
/// Largest request the zygote accepts (a start request is a few KiB).
pub const MAX_REQUEST: usize = 256 * 1024;

/// What handles one request in a forked copy: the one-request launcher (`request`, the
/// compiled seccomp policy); it writes the reply to stdout and exits.
pub type Handler = fn(&[u8], Option<&[seccompiler::BpfProgram]>) -> !;

/// Serve requests from stdin until the server's end closes. Never returns.
pub fn serve(answer: Handler) -> ! {
    let programs = match crate::seccomp::builtin_programs() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bulkhead launcher: cannot compile the seccomp policy: {e}");
            // SAFETY: leaving the process.
            unsafe { libc::_exit(1) }
        }
    };
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        // Handlers that finished since the last request. Reaped (not ignored) so their CPU time
        // adds up in the zygote's, where `bulkhead-bench` and any process accounting see it.
        reap(libc::WNOHANG);
        let (n, reply) = match recv_with_fd(0, &mut buf) {
            Ok(Received::Closed) => {
                // The server is gone: wait for the handlers in flight, then leave.
                reap(0);
                // SAFETY: leaving the process.
                unsafe { libc::_exit(0) }
            }
            Ok(Received::Message(n, fd)) => (n, fd),
            // An oversized request: its reply pipe is closed already, the server sees EOF.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::InvalidData
                ) =>
            {
                continue;
            }
            Err(e) => {
                eprintln!("bulkhead launcher: zygote cannot read requests: {e}");
                // SAFETY: leaving the process.
                unsafe { libc::_exit(1) }
            }
        };
        // A message without a reply pipe cannot be answered: the server sees nothing of it.
        let Some(reply) = reply else { continue };
        // SAFETY: the zygote is single-threaded, so the child is a complete copy of it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            handle(&buf[..n], reply, &programs, answer);
        }
        // The handler has its copy (or the fork failed and the server sees EOF at once).
        drop(reply);
    }
}

/// Reap finished handlers (`flags`: `WNOHANG`, or 0 to wait for all).
fn reap(flags: libc::c_int) {
    loop {
        // SAFETY: waiting for our own children; no status is read.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), flags) };
        if r > 0 {
            continue;
        }
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return;
    }
}

/// In the forked handler: stdout to the reply pipe, stdin from /dev/null, then one request.
fn handle(
    request: &[u8],
    reply: OwnedFd,
    programs: &[seccompiler::BpfProgram],
    answer: Handler,
) -> ! {
    let null = std::fs::File::open("/dev/null");
    // SAFETY: duplicating valid descriptors onto stdio.
    unsafe {
        libc::dup2(reply.as_raw_fd(), 1);
        if let Ok(null) = &null {
            libc::dup2(null.as_raw_fd(), 0);
        }
    }
    drop(reply);
    drop(null);
    answer(request, Some(programs))
}

/// What [`recv_with_fd`] got.
#[derive(Debug)]
pub enum Received {
    /// The peer closed its end.
    Closed,
    /// A message of this many bytes and the descriptor it carried, if any.
    Message(usize, Option<OwnedFd>),
}

/// Receive one message and at most one descriptor from a `SOCK_SEQPACKET` socket. A message
/// longer than `buf` is an error (`InvalidData`); any descriptor it carried is closed.
pub fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one descriptor, aligned for cmsghdr.
    let mut cmsg = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid starting value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg);
    // SAFETY: `msg` points at live buffers of the given sizes.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let owned = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fd.is_none() {
        return Ok(Received::Closed);
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a launch request longer than {} bytes", buf.len()),
        ));
    }
    Ok(Received::Message(n as usize, fd))
}

/// Send `data` with `fd` attached, without blocking (`WouldBlock` when the zygote is behind).
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    let mut cmsg = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid starting value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: the control buffer is large enough for one descriptor (checked by CMSG_SPACE
    // against its 64 bytes); the header fields are set before the data is written.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        libc::CMSG_DATA(c).cast::<RawFd>().write_unaligned(fd);
    }
    // SAFETY: `msg` points at live buffers of the given sizes.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A connected `SOCK_SEQPACKET` pair, both ends close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid two-element array.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_message_carries_its_reply_pipe() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = std::io::pipe().unwrap();
        send_with_fd(a.as_raw_fd(), b"hello", w.as_raw_fd()).unwrap();
        drop(w);
        let mut buf = [0u8; 64];
        let Received::Message(n, Some(fd)) = recv_with_fd(b.as_raw_fd(), &mut buf).unwrap() else {
            panic!("no descriptor")
        };
        assert_eq!(&buf[..n], b"hello");
        std::fs::File::from(fd).write_all(b"reply").unwrap();
        let mut got = String::new();
        std::fs::File::from(OwnedFd::from(r))
            .read_to_string(&mut got)
            .unwrap();
        assert_eq!(got, "reply");
        drop(a);
        assert!(matches!(
            recv_with_fd(b.as_raw_fd(), &mut buf).unwrap(),
            Received::Closed
        ));
    }

    #[test]
    fn oversized_requests_are_refused() {
        let (a, b) = seqpacket_pair().unwrap();
        let (_r, w) = std::io::pipe().unwrap();
        send_with_fd(a.as_raw_fd(), &[7u8; 100], w.as_raw_fd()).unwrap();
        let mut buf = [0u8; 10];
        let e = recv_with_fd(b.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
