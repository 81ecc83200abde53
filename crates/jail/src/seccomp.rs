//! The seccomp policy is data: `policy/seccomp.json` is compiled into the binary, parsed and
//! validated here, and turned into BPF with `seccompiler`. Because seccompiler gives a filter a
//! single match action, the policy compiles to one filter per action plus a small hand-written
//! guard that kills foreign-architecture (i386 `int 0x80`) and x32 syscalls; the kernel runs all
//! of them and the most severe verdict wins.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};
use serde::Deserialize;

/// The checked-in policy.
pub const POLICY_JSON: &str = include_str!("../policy/seccomp.json");

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("The seccomp policy is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("The seccomp policy is invalid: {0}")]
    Invalid(String),
    #[error("seccompiler rejected the policy: {0}")]
    Compile(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub comment: String,
    pub arch: String,
    pub default_action: ActionSpec,
    pub foreign_arch_action: ActionSpec,
    pub x32_action: ActionSpec,
    pub rules: Vec<RuleSpec>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ActionSpec {
    Allow,
    KillProcess,
    Trap,
    Log,
    Errno(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    #[serde(default)]
    pub comment: String,
    pub action: ActionSpec,
    pub syscalls: Vec<String>,
    /// Alternatives: the rule matches when any one condition holds.
    #[serde(default)]
    pub any: Vec<CondSpec>,
    /// Conjunction: the rule matches when every condition holds.
    #[serde(default)]
    pub all: Vec<CondSpec>,
}

/// One argument comparison; exactly one operator field is set. Values are numbers or the
/// symbolic constants [`constant`] knows.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CondSpec {
    pub arg: u8,
    #[serde(default)]
    pub eq: Option<Value>,
    #[serde(default)]
    pub ne: Option<Value>,
    /// `(arg & v) == v`: the flag(s) `v` are set.
    #[serde(default)]
    pub masked_eq: Option<Value>,
    /// Compare all 64 bits (default: the low 32, right for `int` arguments).
    #[serde(default)]
    pub qword: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Num(u64),
    Sym(String),
}

/// An action in a form that can key a map (seccompiler's is not `Ord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    KillProcess,
    Trap,
    Errno(u32),
    Log,
    Allow,
}

impl Action {
    fn to_seccompiler(self) -> SeccompAction {
        match self {
            Action::KillProcess => SeccompAction::KillProcess,
            Action::Trap => SeccompAction::Trap,
            Action::Errno(e) => SeccompAction::Errno(e),
            Action::Log => SeccompAction::Log,
            Action::Allow => SeccompAction::Allow,
        }
    }
    pub fn ret_value(self) -> u32 {
        self.to_seccompiler().into()
    }
}

fn action(spec: &ActionSpec) -> Result<Action, PolicyError> {
    Ok(match spec {
        ActionSpec::Allow => Action::Allow,
        ActionSpec::KillProcess => Action::KillProcess,
        ActionSpec::Trap => Action::Trap,
        ActionSpec::Log => Action::Log,
        ActionSpec::Errno(name) => Action::Errno(
            errno(name).ok_or_else(|| PolicyError::Invalid(format!("unknown errno {name:?}")))?,
        ),
    })
}

fn errno(name: &str) -> Option<u32> {
    Some(match name {
        "EPERM" => libc::EPERM,
        "ENOSYS" => libc::ENOSYS,
        "EACCES" => libc::EACCES,
        "EINVAL" => libc::EINVAL,
        "EAFNOSUPPORT" => libc::EAFNOSUPPORT,
        _ => return None,
    } as u32)
}

/// Symbolic constants usable as condition values.
pub fn constant(name: &str) -> Option<u64> {
    Some(match name {
        "CLONE_NEWNS" => libc::CLONE_NEWNS as u64,
        "CLONE_NEWCGROUP" => libc::CLONE_NEWCGROUP as u64,
        "CLONE_NEWUTS" => libc::CLONE_NEWUTS as u64,
        "CLONE_NEWIPC" => libc::CLONE_NEWIPC as u64,
        "CLONE_NEWUSER" => libc::CLONE_NEWUSER as u64,
        "CLONE_NEWPID" => libc::CLONE_NEWPID as u64,
        "CLONE_NEWNET" => libc::CLONE_NEWNET as u64,
        "CLONE_NEWTIME" => libc::CLONE_NEWTIME as u64,
        "AF_UNIX" => libc::AF_UNIX as u64,
        "AF_INET" => libc::AF_INET as u64,
        "AF_INET6" => libc::AF_INET6 as u64,
        "AF_NETLINK" => libc::AF_NETLINK as u64,
        "AF_PACKET" => libc::AF_PACKET as u64,
        "AF_VSOCK" => libc::AF_VSOCK as u64,
        "AF_ALG" => libc::AF_ALG as u64,
        _ => return None,
    })
}

/// x86_64 syscall numbers by name: the policy may only name syscalls listed here, so a typo
/// fails the unit tests instead of silently allowing the intended syscall.
pub fn syscall_number(name: &str) -> Option<i64> {
    macro_rules! table {
        ($name:expr; $($n:ident),* $(,)?) => {
            match $name {
                $(stringify!($n) => Some(libc::$n as i64),)*
                // Numbers libc does not name (x86_64 table).
                "SYS_create_module" => Some(174),
                "SYS_statmount" => Some(457),
                "SYS_listmount" => Some(458),
                "SYS_open_tree_attr" => Some(467),
                _ => None,
            }
        };
    }
    let full = format!("SYS_{name}");
    #[rustfmt::skip]
    let nr = table!(full.as_str();
        SYS_mount, SYS_umount2, SYS_pivot_root, SYS_move_mount, SYS_open_tree, SYS_fsopen,
        SYS_fsconfig, SYS_fsmount, SYS_fspick, SYS_mount_setattr, SYS_setns, SYS_unshare,
        SYS_clone, SYS_clone3, SYS_fork, SYS_vfork, SYS_init_module, SYS_finit_module,
        SYS_delete_module, SYS_kexec_load, SYS_kexec_file_load, SYS_reboot, SYS_swapon,
        SYS_swapoff, SYS_bpf, SYS_perf_event_open, SYS_keyctl, SYS_add_key, SYS_request_key,
        SYS_userfaultfd, SYS_open_by_handle_at, SYS_name_to_handle_at, SYS_iopl, SYS_ioperm,
        SYS_syslog, SYS_acct, SYS_lookup_dcookie, SYS_nfsservctl, SYS_clock_settime,
        SYS_settimeofday, SYS_adjtimex, SYS_clock_adjtime, SYS_io_uring_setup,
        SYS_io_uring_enter, SYS_io_uring_register, SYS_process_vm_writev,
        SYS_process_vm_readv, SYS_fanotify_init, SYS_quotactl, SYS_quotactl_fd, SYS_socket,
        SYS_socketpair, SYS_ptrace, SYS_personality, SYS_chroot, SYS_mknod, SYS_mknodat,
        SYS_vmsplice, SYS_kcmp, SYS_pidfd_getfd, SYS_uselib, SYS_ustat, SYS_sysfs,
        SYS_vhangup, SYS_setdomainname, SYS_sethostname, SYS_mbind, SYS_migrate_pages,
        SYS_move_pages, SYS_set_mempolicy, SYS_get_mempolicy, SYS_setrlimit,
        SYS_prlimit64, SYS_landlock_create_ruleset, SYS_seccomp, SYS_getpid, SYS_execve,
        SYS_read, SYS_write, SYS_openat,
    );
    nr
}

/// A validated policy, grouped by action: `syscall -> None` means unconditional.
#[derive(Debug)]
pub struct Compiled {
    pub default: Action,
    pub foreign_arch: Action,
    pub x32: Action,
    pub groups: BTreeMap<Action, BTreeMap<i64, Option<Vec<SeccompRule>>>>,
}

impl Policy {
    pub fn parse(json: &str) -> Result<Policy, PolicyError> {
        Ok(serde_json::from_str(json)?)
    }

    pub fn builtin() -> Policy {
        // The file is compiled in and covered by unit tests, so a parse failure is a build bug.
        Policy::parse(POLICY_JSON).expect("builtin seccomp policy parses")
    }

    /// Validate and group the rules.
    pub fn compile(&self) -> Result<Compiled, PolicyError> {
        if self.arch != "x86_64" {
            return Err(PolicyError::Invalid(format!(
                "unsupported arch {:?}",
                self.arch
            )));
        }
        let default = action(&self.default_action)?;
        let mut groups: BTreeMap<Action, BTreeMap<i64, Option<Vec<SeccompRule>>>> = BTreeMap::new();
        let mut owner: BTreeMap<i64, Action> = BTreeMap::new();
        for rule in &self.rules {
            let act = action(&rule.action)?;
            if act == default {
                return Err(PolicyError::Invalid(format!(
                    "rule {:?} repeats the default action",
                    rule.comment
                )));
            }
            if !rule.any.is_empty() && !rule.all.is_empty() {
                return Err(PolicyError::Invalid(format!(
                    "rule {:?} sets both 'any' and 'all'",
                    rule.comment
                )));
            }
            let mut sec_rules = Vec::new();
            for c in &rule.any {
                sec_rules.push(seccomp_rule(vec![condition(c)?])?);
            }
            if !rule.all.is_empty() {
                let conds = rule
                    .all
                    .iter()
                    .map(condition)
                    .collect::<Result<Vec<_>, _>>()?;
                sec_rules.push(seccomp_rule(conds)?);
            }
            if rule.syscalls.is_empty() {
                return Err(PolicyError::Invalid(format!(
                    "rule {:?} has no syscalls",
                    rule.comment
                )));
            }
            for name in &rule.syscalls {
                let nr = syscall_number(name)
                    .ok_or_else(|| PolicyError::Invalid(format!("unknown syscall {name:?}")))?;
                if let Some(prev) = owner.insert(nr, act)
                    && prev != act
                {
                    return Err(PolicyError::Invalid(format!(
                        "syscall {name} has two different actions"
                    )));
                }
                let slot = groups
                    .entry(act)
                    .or_default()
                    .entry(nr)
                    .or_insert(Some(Vec::new()));
                match (slot.as_mut(), sec_rules.is_empty()) {
                    // Unconditional wins over any conditions.
                    (_, true) => *slot = None,
                    (Some(existing), false) => existing.extend(sec_rules.iter().cloned()),
                    (None, false) => {}
                }
            }
        }
        Ok(Compiled {
            default,
            foreign_arch: action(&self.foreign_arch_action)?,
            x32: action(&self.x32_action)?,
            groups,
        })
    }
}

fn seccomp_rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, PolicyError> {
    SeccompRule::new(conds).map_err(|e| PolicyError::Compile(e.to_string()))
}

fn value(v: &Value) -> Result<u64, PolicyError> {
    match v {
        Value::Num(n) => Ok(*n),
        Value::Sym(s) => {
            if let Some(hex) = s.strip_prefix("0x") {
                return u64::from_str_radix(hex, 16)
                    .map_err(|_| PolicyError::Invalid(format!("bad number {s:?}")));
            }
            constant(s).ok_or_else(|| PolicyError::Invalid(format!("unknown constant {s:?}")))
        }
    }
}

fn condition(c: &CondSpec) -> Result<SeccompCondition, PolicyError> {
    let (op, val) = match (&c.eq, &c.ne, &c.masked_eq) {
        (Some(v), None, None) => (SeccompCmpOp::Eq, value(v)?),
        (None, Some(v), None) => (SeccompCmpOp::Ne, value(v)?),
        (None, None, Some(v)) => {
            let v = value(v)?;
            (SeccompCmpOp::MaskedEq(v), v)
        }
        _ => {
            return Err(PolicyError::Invalid(format!(
                "condition on arg {} needs exactly one of eq, ne, masked_eq",
                c.arg
            )));
        }
    };
    let len = if c.qword {
        SeccompCmpArgLen::Qword
    } else {
        SeccompCmpArgLen::Dword
    };
    if !c.qword && val > u64::from(u32::MAX) {
        return Err(PolicyError::Invalid(format!(
            "value {val:#x} does not fit a 32-bit argument"
        )));
    }
    SeccompCondition::new(c.arg, len, op, val).map_err(|e| PolicyError::Compile(e.to_string()))
}

const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}
fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// BPF_LD | BPF_W | BPF_ABS (the class and size bits are zero).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;

impl Compiled {
    /// The BPF programs to install, in order: the architecture/x32 guard, then one filter per
    /// action.
    pub fn programs(&self) -> Result<Vec<BpfProgram>, PolicyError> {
        // seccomp_data: nr at offset 0, arch at offset 4.
        let guard = vec![
            stmt(BPF_LD_W_ABS, 4),
            jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 0, 4),
            stmt(BPF_LD_W_ABS, 0),
            // nr -1 is how a tracer skips a syscall; it is not an x32 call.
            jump(BPF_JMP_JEQ_K, u32::MAX, 1, 0),
            jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 2, 0),
            stmt(BPF_RET_K, self.default.ret_value()),
            stmt(BPF_RET_K, self.foreign_arch.ret_value()),
            stmt(BPF_RET_K, self.x32.ret_value()),
        ];
        let mut out = vec![guard];
        for (act, syscalls) in &self.groups {
            let rules = syscalls
                .iter()
                .map(|(nr, rules)| (*nr, rules.clone().unwrap_or_default()))
                .collect::<BTreeMap<_, _>>();
            let filter = SeccompFilter::new(
                rules,
                self.default.to_seccompiler(),
                act.to_seccompiler(),
                TargetArch::x86_64,
            )
            .map_err(|e| PolicyError::Compile(e.to_string()))?;
            let prog: BpfProgram = filter
                .try_into()
                .map_err(|e: seccompiler::BackendError| PolicyError::Compile(e.to_string()))?;
            out.push(prog);
        }
        Ok(out)
    }
}

/// Compile the builtin policy into BPF programs (done in the launcher before it clones, so a
/// broken policy fails before any namespace exists).
pub fn builtin_programs() -> Result<Vec<BpfProgram>, PolicyError> {
    Policy::builtin().compile()?.programs()
}

/// Install the programs on the calling thread. Requires `no_new_privs` or CAP_SYS_ADMIN in the
/// thread's user namespace; sets neither (`seccompiler::apply_filter` would set
/// `no_new_privs`, which would disable set-uid programs in the sandbox).
pub fn install(programs: &[BpfProgram]) -> Result<(), String> {
    for p in programs {
        if p.is_empty() {
            return Err("empty seccomp program".into());
        }
        let len = u16::try_from(p.len()).map_err(|_| "seccomp program too long".to_string())?;
        let prog = libc::sock_fprog {
            len,
            filter: p.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `prog` points at `p`, which outlives the call; the kernel copies the program.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0u64,
                &prog as *const libc::sock_fprog,
            )
        };
        if r != 0 {
            return Err(format!("seccomp: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instruction subset seccompiler emits, so the tests check
    /// the compiled programs, not just the JSON.
    fn run(prog: &[sock_filter], data: &[u8; 64]) -> u32 {
        let word = |off: u32| {
            let o = off as usize;
            u32::from_le_bytes(data[o..o + 4].try_into().unwrap())
        };
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = &prog[pc];
            pc += 1;
            match i.code {
                0x20 => a = word(i.k),      // ld [k]
                0x54 => a &= i.k,           // and #k
                0x05 => pc += i.k as usize, // ja
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let t = match i.code {
                        0x15 => a == i.k,
                        0x25 => a > i.k,
                        0x35 => a >= i.k,
                        _ => a & i.k != 0,
                    };
                    pc += if t { i.jt } else { i.jf } as usize;
                }
                0x06 => return i.k, // ret #k
                c => panic!("unexpected BPF opcode {c:#x}"),
            }
        }
    }

    fn data(arch: u32, nr: u32, args: [u64; 6]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&nr.to_le_bytes());
        d[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        d
    }

    /// The kernel's combination rule: every filter runs, the lowest (signed) action wins, ties
    /// go to the most recently installed filter.
    fn verdict(progs: &[BpfProgram], arch: u32, nr: i64, args: [u64; 6]) -> u32 {
        let d = data(arch, nr as u32, args);
        let mut ret = libc::SECCOMP_RET_ALLOW;
        for p in progs.iter().rev() {
            let cur = run(p, &d);
            if ((cur & 0xffff_0000) as i32) < ((ret & 0xffff_0000) as i32) {
                ret = cur;
            }
        }
        ret
    }

    fn progs() -> Vec<BpfProgram> {
        builtin_programs().unwrap()
    }

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

    fn check(name: &str, args: [u64; 6]) -> u32 {
        verdict(
            &progs(),
            AUDIT_ARCH_X86_64,
            syscall_number(name).unwrap(),
            args,
        )
    }

    #[test]
    fn required_syscalls_are_denied_with_eperm() {
        let required = [
            "mount",
            "umount2",
            "pivot_root",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
            "setns",
            "unshare",
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "reboot",
            "swapon",
            "swapoff",
            "bpf",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "userfaultfd",
            "open_by_handle_at",
            "name_to_handle_at",
            "iopl",
            "ioperm",
            "syslog",
            "acct",
            "clock_settime",
            "settimeofday",
            "adjtimex",
            "clock_adjtime",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "process_vm_writev",
            "fanotify_init",
            "quotactl",
        ];
        for name in required {
            assert_eq!(check(name, [0; 6]), EPERM, "{name} must be EPERM");
        }
    }

    #[test]
    fn clone3_is_enosys_so_libc_falls_back() {
        assert_eq!(check("clone3", [0; 6]), ENOSYS);
    }

    #[test]
    fn clone_with_namespace_flags_is_denied_plain_fork_allowed() {
        let fork_flags =
            (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64 | libc::SIGCHLD as u64;
        assert_eq!(check("clone", [fork_flags, 0, 0, 0, 0, 0]), ALLOW);
        let thread_flags = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        assert_eq!(check("clone", [thread_flags, 0, 0, 0, 0, 0]), ALLOW);
        for f in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ] {
            let flags = fork_flags | f as u64;
            assert_eq!(check("clone", [flags, 0, 0, 0, 0, 0]), EPERM, "flag {f:#x}");
        }
    }

    #[test]
    fn socket_families_are_filtered() {
        for fam in [
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
        ] {
            assert_eq!(
                check("socket", [fam as u64, 1, 0, 0, 0, 0]),
                ALLOW,
                "family {fam}"
            );
        }
        for fam in [
            libc::AF_VSOCK,
            libc::AF_PACKET,
            libc::AF_ALG,
            libc::AF_BLUETOOTH,
        ] {
            assert_eq!(
                check("socket", [fam as u64, 1, 0, 0, 0, 0]),
                EPERM,
                "family {fam}"
            );
        }
    }

    #[test]
    fn ordinary_syscalls_are_allowed() {
        for name in [
            "read", "write", "openat", "execve", "getpid", "fork", "vfork", "ptrace",
        ] {
            assert_eq!(check(name, [0; 6]), ALLOW, "{name}");
        }
    }

    #[test]
    fn foreign_arch_and_x32_are_killed() {
        const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
        assert_eq!(verdict(&progs(), AUDIT_ARCH_I386, 20, [0; 6]), KILL);
        let x32_getpid = i64::from(X32_SYSCALL_BIT) + libc::SYS_getpid;
        assert_eq!(
            verdict(&progs(), AUDIT_ARCH_X86_64, x32_getpid, [0; 6]),
            KILL
        );
        // A tracer's "skip this syscall" (-1) is left alone.
        assert_eq!(verdict(&progs(), AUDIT_ARCH_X86_64, -1, [0; 6]), ALLOW);
    }

    #[test]
    fn every_builtin_name_resolves() {
        let p = Policy::builtin();
        for r in &p.rules {
            for s in &r.syscalls {
                assert!(syscall_number(s).is_some(), "{s}");
            }
        }
    }

    #[test]
    fn invalid_policies_are_rejected() {
        let base = |rules: &str| {
            format!(
                r#"{{"arch":"x86_64","default_action":"allow","foreign_arch_action":"kill_process",
                    "x32_action":"kill_process","rules":[{rules}]}}"#
            )
        };
        let err = |rules: &str| Policy::parse(&base(rules)).unwrap().compile().unwrap_err();
        assert!(
            err(r#"{"action":{"errno":"EPERM"},"syscalls":["mountt"]}"#)
                .to_string()
                .contains("unknown syscall")
        );
        assert!(
            err(r#"{"action":{"errno":"EWHAT"},"syscalls":["mount"]}"#)
                .to_string()
                .contains("unknown errno")
        );
        assert!(
            err(r#"{"action":{"errno":"EPERM"},"syscalls":["socket"],"all":[{"arg":0,"ne":"AF_NOPE"}]}"#)
                .to_string()
                .contains("unknown constant")
        );
        assert!(
            err(r#"{"action":{"errno":"EPERM"},"syscalls":["mount"]},
                   {"action":{"errno":"ENOSYS"},"syscalls":["mount"]}"#)
            .to_string()
            .contains("two different actions")
        );
        assert!(
            err(r#"{"action":"allow","syscalls":["mount"]}"#)
                .to_string()
                .contains("repeats the default")
        );
        assert!(
            err(r#"{"action":{"errno":"EPERM"},"syscalls":["socket"],"any":[{"arg":0}]}"#)
                .to_string()
                .contains("exactly one of")
        );
        // Unknown fields are typos, not silently ignored options.
        assert!(Policy::parse(&base(r#"{"action":"trap","syscall":["mount"]}"#)).is_err());
    }

    #[test]
    fn unconditional_rule_wins_over_conditional_for_the_same_syscall() {
        let json = r#"{"arch":"x86_64","default_action":"allow","foreign_arch_action":"kill_process",
            "x32_action":"kill_process","rules":[
              {"action":{"errno":"EPERM"},"syscalls":["socket"],"all":[{"arg":0,"eq":"AF_VSOCK"}]},
              {"action":{"errno":"EPERM"},"syscalls":["socket"]}]}"#;
        let progs = Policy::parse(json)
            .unwrap()
            .compile()
            .unwrap()
            .programs()
            .unwrap();
        let v = verdict(
            &progs,
            AUDIT_ARCH_X86_64,
            libc::SYS_socket,
            [libc::AF_INET as u64, 0, 0, 0, 0, 0],
        );
        assert_eq!(v, EPERM);
    }
}
