//! Exit status in the form envd reports it: Go's `os.ProcessState`.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use bulkhead_envd::process::process_event::EndEvent;

/// Go's description of a signal (`syscall.Signal.String()` on Linux), e.g. `killed`.
pub fn signal_description(signal: i32) -> String {
    let text = match signal {
        libc::SIGHUP => "hangup",
        libc::SIGINT => "interrupt",
        libc::SIGQUIT => "quit",
        libc::SIGILL => "illegal instruction",
        libc::SIGTRAP => "trace/breakpoint trap",
        libc::SIGABRT => "aborted",
        libc::SIGBUS => "bus error",
        libc::SIGFPE => "floating point exception",
        libc::SIGKILL => "killed",
        libc::SIGUSR1 => "user defined signal 1",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGUSR2 => "user defined signal 2",
        libc::SIGPIPE => "broken pipe",
        libc::SIGALRM => "alarm clock",
        libc::SIGTERM => "terminated",
        libc::SIGSTKFLT => "stack fault",
        libc::SIGCHLD => "child exited",
        libc::SIGCONT => "continued",
        libc::SIGSTOP => "stopped (signal)",
        libc::SIGTSTP => "stopped",
        libc::SIGTTIN => "stopped (tty input)",
        libc::SIGTTOU => "stopped (tty output)",
        libc::SIGURG => "urgent I/O condition",
        libc::SIGXCPU => "CPU time limit exceeded",
        libc::SIGXFSZ => "file size limit exceeded",
        libc::SIGVTALRM => "virtual timer expired",
        libc::SIGPROF => "profiling timer expired",
        libc::SIGWINCH => "window changed",
        libc::SIGIO => "I/O possible",
        libc::SIGPWR => "power failure",
        libc::SIGSYS => "bad system call",
        other => return format!("signal {other}"),
    };
    text.to_owned()
}

/// Go's `ProcessState.String()` for a wait status.
pub fn status_string(status: ExitStatus) -> String {
    let mut text = if let Some(code) = status.code() {
        format!("exit status {code}")
    } else if let Some(signal) = status.signal() {
        format!("signal: {}", signal_description(signal))
    } else if let Some(signal) = status.stopped_signal() {
        format!("stop signal: {}", signal_description(signal))
    } else if status.continued() {
        "continued".to_owned()
    } else {
        format!("unknown wait status {:#x}", status.into_raw())
    };
    if status.core_dumped() {
        text.push_str(" (core dumped)");
    }
    text
}

/// The `end` event for a reaped process: exit code (-1 when killed by a signal), whether it
/// exited normally, the status text, and — like envd, which reports Go's `cmd.Wait()` error —
/// the status text again as `error` when the process did not exit with 0.
pub fn end_event(status: ExitStatus) -> EndEvent {
    let text = status_string(status);
    let success = status.code() == Some(0);
    EndEvent {
        exit_code: status.code().unwrap_or(-1),
        exited: status.code().is_some(),
        status: text.clone(),
        error: (!success).then_some(text),
    }
}

/// The `end` event when waiting for the process failed.
pub fn wait_failed_event(error: &std::io::Error) -> EndEvent {
    EndEvent {
        exit_code: -1,
        exited: false,
        status: String::new(),
        error: Some(format!("waiting for the process failed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mimics_go_process_state() {
        let exited = |code: i32| ExitStatus::from_raw(code << 8);
        let signaled = |sig: i32| ExitStatus::from_raw(sig);
        assert_eq!(status_string(exited(0)), "exit status 0");
        assert_eq!(status_string(exited(1)), "exit status 1");
        assert_eq!(status_string(signaled(libc::SIGKILL)), "signal: killed");
        assert_eq!(status_string(signaled(libc::SIGTERM)), "signal: terminated");
        assert_eq!(
            status_string(signaled(libc::SIGSEGV | 0x80)),
            "signal: segmentation fault (core dumped)"
        );
        assert_eq!(status_string(signaled(40)), "signal: signal 40");

        let ok = end_event(exited(0));
        assert_eq!((ok.exit_code, ok.exited, ok.error), (0, true, None));
        let failed = end_event(exited(3));
        assert_eq!(
            (failed.exit_code, failed.error.as_deref()),
            (3, Some("exit status 3"))
        );
        let killed = end_event(signaled(libc::SIGKILL));
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
    }
}
