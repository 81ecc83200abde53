//! Making a [`JailDriver`]: validate the configuration, prepare the state directory, install
//! the agent, detect the cgroup layout, become a child subreaper.

use std::fs;
use std::io;
use std::sync::{Arc, Mutex};

use super::fsutil::{check_searchable, install_agent, mkdir_mode};
use super::state::{Inner, JailDriver};
use crate::cgroup;
use crate::mountplan::SOCK_NAME;
use crate::slots::{self, SlotTable};
use crate::{IDS_PER_SLOT, JailConfig, JailError};

impl JailDriver {
    /// Validate the configuration, prepare the state directory, detect the cgroup layout and
    /// make this process a child subreaper (sandbox inits are re-parented to it when their
    /// launcher exits).
    pub fn new(cfg: JailConfig) -> Result<JailDriver, JailError> {
        if cfg.launcher.is_empty() {
            return Err(JailError::Config("launcher command is empty".into()));
        }
        if cfg.max_slots == 0 {
            return Err(JailError::Config("max_slots must be at least 1".into()));
        }
        if !slots::uid_range_fits(cfg.uid_base, cfg.max_slots) {
            return Err(JailError::Config(format!(
                "{} slots of {IDS_PER_SLOT} ids from uid {} exceed the uid space",
                cfg.max_slots, cfg.uid_base
            )));
        }
        if cfg.uid_base == 0 {
            return Err(JailError::Config(
                "uid_base 0 would map sandbox root to host root".into(),
            ));
        }
        if !cfg.state_dir.is_absolute() {
            return Err(JailError::Config(format!(
                "state_dir must be absolute: {}",
                cfg.state_dir.display()
            )));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(JailError::Unsupported(
                "the jail driver must run as root".into(),
            ));
        }
        let agent = fs::metadata(&cfg.agent_binary).map_err(|e| {
            JailError::io(format!("agent binary {}", cfg.agent_binary.display()), e)
        })?;
        if !agent.is_file() {
            return Err(JailError::Config(format!(
                "agent binary {} is not a regular file",
                cfg.agent_binary.display()
            )));
        }
        // 0711: the sandbox uids may traverse (to reach their own slot), not list.
        for d in [
            cfg.state_dir.clone(),
            cfg.state_dir.join("s"),
            cfg.state_dir.join("l"),
            cfg.state_dir.join("ca"),
        ] {
            mkdir_mode(&d, 0o711)?;
        }
        check_searchable(&cfg.state_dir, "state_dir")?;
        let agent = install_agent(&cfg.agent_binary, &cfg.state_dir)?;
        let sock = cfg
            .state_dir
            .join(format!("s/{}/sock/{SOCK_NAME}", cfg.max_slots - 1));
        if sock.as_os_str().len() >= 108 {
            return Err(JailError::Config(format!(
                "state_dir is too long: agent socket paths ({}) exceed the 107-byte Unix socket limit",
                sock.display()
            )));
        }
        let cgroups = cgroup::detect(&cfg.cgroup_parent)
            .map_err(|e| JailError::Unsupported(e.to_string()))?;
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(JailError::io(
                "PR_SET_CHILD_SUBREAPER",
                io::Error::last_os_error(),
            ));
        }
        settle_leftover_criu(&cfg);
        let slots = Mutex::new(SlotTable::new(cfg.max_slots));
        Ok(JailDriver {
            inner: Arc::new(Inner {
                launcher: super::launch::Launcher::new(cfg.launcher.clone()),
                cfg,
                agent,
                cgroups,
                slots,
                checkpoint_key: std::sync::OnceLock::new(),
                stale_cgroups: Mutex::new(Vec::new()),
            }),
        })
    }
}

/// How long a restarted server lets a dump or restore its predecessor started finish.
const LEFTOVER_CRIU_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

/// A server that died during a dump or restore leaves its CRIU running: left alone, a dump
/// re-freezes the sandbox after this server thawed it. Killing it mid-dump could leave parasite
/// code in the sandbox's processes, so it gets a short while to finish first (a dump of a
/// sandbox takes well under a second), then SIGKILL. Only this server's: their command lines
/// name its state dir (restores) or its cgroup subtree (dumps).
fn settle_leftover_criu(cfg: &JailConfig) {
    let Some(criu) = &cfg.criu else { return };
    let marks = [
        cfg.state_dir.display().to_string(),
        format!("/{}/", cfg.cgroup_parent.trim_matches('/')),
    ];
    let until = std::time::Instant::now() + LEFTOVER_CRIU_BUDGET;
    let mut left = crate::criu::leftover_processes(criu, &marks);
    if left.is_empty() {
        return;
    }
    tracing::warn!(pids = ?left, "waiting for CRIU runs a previous server left behind");
    while !left.is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
        left = crate::criu::leftover_processes(criu, &marks);
    }
    for pid in left {
        tracing::warn!(pid, "killing a CRIU run a previous server left behind");
        // SAFETY: plain syscall; the pid was just checked to run CRIU for this server.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
