//! A stand-in for `bulkhead-agent` used by the jail integration tests: it listens where the
//! real agent would (`--listen unix:PATH`) and answers one line-based request per connection:
//!
//! ```text
//! ping              -> pong
//! sh <script>       -> "exit <code>" or "signal <n>", a newline, then stdout+stderr
//! probe <name>      -> "ok", "errno <n>" or "signal <n>" (a syscall the sandbox should deny)
//! hog <mib>         -> how a child that touches <mib> MiB of memory ended
//! forkbomb <n>      -> "forked <a> failed <b>" (children are killed afterwards)
//! GET /health ...   -> an HTTP/1.1 204 response (the driver conformance suite's probe;
//!                      other paths get 404)
//! ```
//!
//! `--fail` makes it exit with status 3 right away (tests the driver's start error path).
//! It runs as pid 1 of the sandbox, handles requests one at a time and reaps orphans.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--fail") {
        eprintln!("test agent failing on purpose");
        std::process::exit(3);
    }
    let Some(path) = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1))
        .and_then(|l| l.strip_prefix("unix:"))
    else {
        eprintln!("usage: bulkhead-jail-test-agent --listen unix:PATH");
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap_or_else(|e| {
        eprintln!("bind {path}: {e}");
        std::process::exit(1)
    });
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut line = String::new();
        if BufReader::new(&conn).read_line(&mut line).is_ok() {
            let reply = handle(line.trim_end_matches('\n'));
            let _ = conn.write_all(reply.as_bytes());
        }
        drop(conn);
        reap_orphans();
    }
}

fn reap_orphans() {
    // SAFETY: non-blocking wait for any child.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

fn handle(req: &str) -> String {
    let (cmd, arg) = req.split_once(' ').unwrap_or((req, ""));
    match cmd {
        // Only the request line is read; the connection is closed after the reply.
        "GET" | "POST" => {
            let path = arg.split(' ').next();
            let status = if (cmd, path) == ("GET", Some("/health")) {
                "204 No Content"
            } else {
                "404 Not Found"
            };
            format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        }
        "ping" => "pong".into(),
        "sh" => sh(arg),
        "probe" => probe(arg),
        "hog" => hog(arg.parse().unwrap_or(0)),
        "forkbomb" => forkbomb(arg.parse().unwrap_or(0)),
        _ => format!("unknown request {req:?}"),
    }
}

fn sh(script: &str) -> String {
    match Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .output()
    {
        Ok(out) => {
            use std::os::unix::process::ExitStatusExt;
            let head = match (out.status.code(), out.status.signal()) {
                (Some(c), _) => format!("exit {c}"),
                (None, Some(s)) => format!("signal {s}"),
                _ => "exit ?".into(),
            };
            format!(
                "{head}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        }
        Err(e) => format!("spawn failed: {e}"),
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn result(r: i64) -> String {
    if r < 0 {
        format!("errno {}", errno())
    } else {
        "ok".into()
    }
}

/// Fork; run `f` in the child and `_exit(0)` after it; report how the child ended.
fn in_child(f: impl FnOnce()) -> String {
    // SAFETY: the agent is single-threaded, so fork is sound.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        f();
        // SAFETY: leaving the child.
        unsafe { libc::_exit(0) };
    }
    if pid < 0 {
        return format!("fork errno {}", errno());
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFSIGNALED(status) {
        format!("signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit {}", libc::WEXITSTATUS(status))
    }
}

fn socket(family: libc::c_int, ty: libc::c_int, proto: libc::c_int) -> i64 {
    // SAFETY: plain syscall; a created socket is closed right away.
    let fd = unsafe { libc::socket(family, ty, proto) };
    if fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }
    i64::from(fd)
}

fn clone_ns(flag: libc::c_int) -> String {
    let flags = (flag | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: fork-like clone in a single-threaded process; the child exits at once.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid == 0 {
        // SAFETY: leaving the child.
        unsafe { libc::_exit(0) };
    }
    if pid < 0 {
        return format!("errno {}", errno());
    }
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
    "ok".into()
}

fn probe(name: &str) -> String {
    let r: i64 = match name {
        // Every arm below: raw syscalls with valid or null pointers; each one is expected to be
        // refused, and anything it creates is released.
        // SAFETY: see above.
        "mount" => unsafe {
            i64::from(libc::mount(
                c"none".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            ))
        },
        // SAFETY: see above.
        "umount" => unsafe { i64::from(libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH)) },
        // SAFETY: see above.
        "unshare_user" => unsafe { i64::from(libc::unshare(libc::CLONE_NEWUSER)) },
        // SAFETY: see above.
        "unshare_ns" => unsafe { i64::from(libc::unshare(libc::CLONE_NEWNS)) },
        // SAFETY: see above.
        "unshare_net" => unsafe { i64::from(libc::unshare(libc::CLONE_NEWNET)) },
        // SAFETY: see above.
        "setns" => unsafe { i64::from(libc::setns(0, 0)) },
        "clone_newuser" => return clone_ns(libc::CLONE_NEWUSER),
        "clone_newns" => return clone_ns(libc::CLONE_NEWNS),
        "clone_newpid" => return clone_ns(libc::CLONE_NEWPID),
        "clone_newnet" => return clone_ns(libc::CLONE_NEWNET),
        // SAFETY: see above.
        "clone3" => unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) },
        "vsock" => socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0),
        "packet" => socket(libc::AF_PACKET, libc::SOCK_RAW, 0),
        "alg" => socket(libc::AF_ALG, libc::SOCK_SEQPACKET, 0),
        "inet" => socket(libc::AF_INET, libc::SOCK_STREAM, 0),
        "inet6" => socket(libc::AF_INET6, libc::SOCK_DGRAM, 0),
        "unix" => socket(libc::AF_UNIX, libc::SOCK_STREAM, 0),
        "netlink" => socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
        // SAFETY: see above.
        "bpf" => unsafe { libc::syscall(libc::SYS_bpf, 0, std::ptr::null::<u8>(), 0) },
        "io_uring" => {
            let mut params = [0u8; 120];
            // SAFETY: see above; `params` is a zeroed io_uring_params-sized buffer.
            let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) };
            if fd >= 0 {
                // SAFETY: our own descriptor.
                unsafe { libc::close(fd as i32) };
            }
            fd
        }
        // SAFETY: see above (KEYCTL_GET_KEYRING_ID of the session keyring).
        "keyctl" => unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) },
        "perf_event_open" => {
            let mut attr = [0u8; 128];
            attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
            // SAFETY: see above.
            unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_mut_ptr(), 0, -1, -1, 0) }
        }
        // SAFETY: see above.
        "userfaultfd" => unsafe { libc::syscall(libc::SYS_userfaultfd, 0) },
        // SAFETY: see above.
        "open_tree" => unsafe {
            libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c"/".as_ptr(), 1)
        },
        // SAFETY: see above.
        "fsopen" => unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0) },
        // SAFETY: see above.
        "pivot_root" => unsafe {
            libc::syscall(libc::SYS_pivot_root, c"/".as_ptr(), c"/".as_ptr())
        },
        // SAFETY: see above.
        "init_module" => unsafe {
            libc::syscall(
                libc::SYS_init_module,
                std::ptr::null::<u8>(),
                0,
                c"".as_ptr(),
            )
        },
        // SAFETY: see above.
        "kexec_load" => unsafe { libc::syscall(libc::SYS_kexec_load, 0, 0, 0, 0) },
        // SAFETY: see above.
        "syslog" => unsafe { libc::syscall(libc::SYS_syslog, 3, std::ptr::null::<u8>(), 0) },
        "x32" => {
            return in_child(|| {
                // SAFETY: an x32-ABI syscall number (bit 30 set); the filter kills us.
                unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
            });
        }
        "i386" => {
            return in_child(|| {
                // SAFETY: the 32-bit entry with eax = 20 (getpid on i386); the filter kills us.
                unsafe { std::arch::asm!("int 0x80", inout("eax") 20u32 => _, options(nostack)) }
            });
        }
        _ => return format!("unknown probe {name:?}"),
    };
    result(r)
}

fn hog(mib: usize) -> String {
    in_child(|| {
        let mut keep: Vec<Vec<u8>> = Vec::new();
        for _ in 0..mib {
            let mut v = vec![0u8; 1 << 20];
            for i in (0..v.len()).step_by(4096) {
                v[i] = 1;
            }
            keep.push(v);
        }
        std::hint::black_box(&keep);
    })
}

fn forkbomb(n: usize) -> String {
    let (mut kids, mut failed) = (Vec::new(), 0);
    for _ in 0..n {
        // SAFETY: single-threaded fork; the child only pauses until it is killed.
        let pid = unsafe { libc::fork() };
        match pid {
            0 => loop {
                // SAFETY: waiting for a signal.
                unsafe { libc::pause() };
            },
            p if p < 0 => failed += 1,
            p => kids.push(p),
        }
    }
    for &k in &kids {
        // SAFETY: killing and reaping our own children.
        unsafe {
            libc::kill(k, libc::SIGKILL);
            libc::waitpid(k, std::ptr::null_mut(), 0);
        }
    }
    format!("forked {} failed {failed}", kids.len())
}
