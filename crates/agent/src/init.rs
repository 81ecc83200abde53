//! Acting as the sandbox's init process.
//!
//! The agent is the first process of the sandbox's pid namespace. pid 1 has two duties the
//! server should not mix with its work: orphaned processes are re-parented to it and must be
//! reaped, or they stay zombies; and when it exits, the kernel kills the whole namespace. So
//! pid 1 only starts a new session (so the sandbox does not share one with the launcher), forks
//! the real server, reaps every child with `waitpid(-1)`, forwards termination signals to the
//! server, and exits with the server's status. This happens before any thread exists (tokio is
//! started in the child), so forking is safe.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid, setsid};

/// The server's pid, read by the signal handler.
static SERVER_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(signal: libc::c_int) {
    let pid = SERVER_PID.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, signal) };
    }
}

/// When this process is pid 1, becomes the init process: returns in the forked server child,
/// and never returns in pid 1 itself (it exits with the server's status). Otherwise returns at
/// once.
pub fn become_init_if_pid1() {
    if getpid() != Pid::from_raw(1) {
        return;
    }
    // Fails with EPERM when already a group leader; the session is then ours anyway.
    let _ = setsid();
    // SAFETY: no other thread exists yet (this runs before the tokio runtime is built), so the
    // child may run arbitrary code.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {}
        Ok(ForkResult::Parent { child }) => reap_forever(child),
        Err(e) => {
            // Serve from pid 1 itself rather than not at all; orphans then stay zombies.
            eprintln!("bulkhead-agent: fork failed ({e}); serving without a reaper");
        }
    }
}

fn reap_forever(server: Pid) -> ! {
    SERVER_PID.store(server.as_raw(), Ordering::Relaxed);
    let action = SigAction::new(
        SigHandler::Handler(forward_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        // SAFETY: the handler only calls the async-signal-safe kill().
        let _ = unsafe { sigaction(signal, &action) };
    }
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == server => std::process::exit(code),
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == server => {
                std::process::exit(128 + signal as i32)
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                eprintln!("bulkhead-agent: waitpid failed: {e}");
                std::process::exit(1);
            }
        }
    }
}
