//! Honest test gating: the one way a Bulkhead test depends on a host capability (root,
//! `/dev/net/tun`, Jupyter kernels, PostgreSQL, CRIU, QEMU, ...).
//!
//! A gated test carries [`requires`]:
//!
//! ```text
//! #[bulkhead_testkit::requires(Root, Tun)]
//! #[tokio::test]
//! async fn sandbox_network_link() { ... }
//! ```
//!
//! - `cargo test` reports it as `ignored, requires root (namespaces, mounts, cgroups),
//!   /dev/net/tun`: a laptop run says what it did not test instead of passing it.
//! - `cargo test -- --include-ignored` (what `scripts/test.sh` and so CI run) runs it; on a
//!   host without a capability it FAILS with what is missing and how to provide it. A broken CI
//!   host therefore turns red, never into green nothing.
//!
//! libtest cannot decide "ignored" at run time, hence the attribute plus the check. Needs that
//! only one crate can probe (the jail driver's host report, `unshare --pid`) go through
//! [`require_host`], called from the test or its harness.

use std::path::PathBuf;
use std::process::{Command, Stdio};

pub mod rootfs;

/// Gates a test: `#[ignore = "requires ..."]` plus a first-statement [`require`] call. Put it
/// above `#[test]` / `#[tokio::test]`; identifiers are [`Capability`] variants, string literals
/// name needs the test checks itself (e.g. `"a reachable Debian mirror"`).
pub use bulkhead_testkit_macros::requires;

// So `#[requires]` (which names `::bulkhead_testkit`) works in this crate's own tests too.
extern crate self as bulkhead_testkit;

include!("../../testkit-macros/src/capabilities.rs");

/// A host capability a test can need. Names and descriptions: `CAPABILITIES`, shared with
/// the macro.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Effective uid 0.
    Root,
    /// `/dev/net/tun` opens for reading and writing.
    Tun,
    /// A venv with ipykernel, bash_kernel and duckdb ([`kernel_venv`]).
    KernelVenv,
    /// `BULKHEAD_TEST_POSTGRES_URL` names a database ([`postgres_url`]).
    Postgres,
    /// `BULKHEAD_TEST_EXTRA_CA` names a readable PEM bundle ([`extra_ca_bundle`]).
    ExtraCaBundle,
    /// The `criu` binary runs.
    Criu,
    /// `qemu-system-x86_64` runs (the microvm driver falls back to TCG without KVM).
    Qemu,
    /// `BULKHEAD_GUEST_KERNEL` names the guest kernel's `bzImage` ([`guest_kernel`]).
    GuestKernel,
}

/// Where the Jupyter kernel venv is when `BULKHEAD_TEST_KERNEL_VENV` is not set.
pub const DEFAULT_KERNEL_VENV: &str = "/var/cache/bulkhead/venv-agent-kernels";
pub const KERNEL_VENV_ENV: &str = "BULKHEAD_TEST_KERNEL_VENV";
pub const POSTGRES_ENV: &str = "BULKHEAD_TEST_POSTGRES_URL";
pub const EXTRA_CA_ENV: &str = "BULKHEAD_TEST_EXTRA_CA";
/// The CRIU binary the tests use (scripts/criu.sh prints its path); `criu` on PATH otherwise.
pub const CRIU_ENV: &str = "BULKHEAD_CRIU";

/// The microvm driver's guest kernel (`<dir printed by scripts/guest-kernel.sh>/bzImage`).
pub const GUEST_KERNEL_ENV: &str = "BULKHEAD_GUEST_KERNEL";

/// The guest kernel for microvm tests: `$BULKHEAD_GUEST_KERNEL`.
pub fn guest_kernel() -> Option<std::path::PathBuf> {
    std::env::var_os(GUEST_KERNEL_ENV).map(std::path::PathBuf::from)
}

/// The CRIU binary for tests that checkpoint: `$BULKHEAD_CRIU`, else `criu` from PATH.
pub fn criu_binary() -> std::path::PathBuf {
    std::env::var_os(CRIU_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "criu".into())
}

impl Capability {
    pub const ALL: [Capability; 8] = [
        Capability::Root,
        Capability::Tun,
        Capability::KernelVenv,
        Capability::Postgres,
        Capability::ExtraCaBundle,
        Capability::Criu,
        Capability::Qemu,
        Capability::GuestKernel,
    ];

    /// What the test needs, as its `#[ignore]` reason says it.
    pub fn describe(self) -> &'static str {
        let name = format!("{self:?}");
        CAPABILITIES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("an unnamed capability", |(_, what)| what)
    }

    /// `Err(why it is missing)` when this host lacks the capability.
    pub fn check(self) -> Result<(), String> {
        match self {
            Capability::Root => {
                // SAFETY: geteuid has no preconditions and cannot fail.
                let euid = unsafe { libc::geteuid() };
                if euid == 0 {
                    Ok(())
                } else {
                    Err(format!("running as uid {euid}, not root"))
                }
            }
            Capability::Tun => open_rw("/dev/net/tun"),
            Capability::KernelVenv => {
                let dir = kernel_venv_dir();
                let python = dir.join("bin/python");
                let out = Command::new(&python)
                    .args(["-c", "import ipykernel, bash_kernel, duckdb"])
                    .stdin(Stdio::null())
                    .output();
                match out {
                    Ok(o) if o.status.success() => Ok(()),
                    Ok(o) => Err(format!(
                        "{} cannot import ipykernel, bash_kernel and duckdb: {}",
                        python.display(),
                        String::from_utf8_lossy(&o.stderr).trim()
                    )),
                    Err(e) => Err(format!("no venv at {} ({e})", dir.display())),
                }
            }
            Capability::Postgres => match std::env::var(POSTGRES_ENV) {
                Ok(url) if !url.is_empty() => Ok(()),
                _ => Err(format!("{POSTGRES_ENV} is not set")),
            },
            Capability::ExtraCaBundle => match std::env::var_os(EXTRA_CA_ENV) {
                Some(path) => std::fs::metadata(&path)
                    .map(|_| ())
                    .map_err(|e| format!("{EXTRA_CA_ENV}={} is unreadable: {e}", path.display())),
                None => Err(format!("{EXTRA_CA_ENV} is not set")),
            },
            Capability::Criu => {
                let bin = criu_binary();
                runs(&bin.to_string_lossy(), &["--version"])
            }
            Capability::Qemu => runs("qemu-system-x86_64", &["--version"]),
            Capability::GuestKernel => match guest_kernel() {
                Some(path) if path.is_file() => Ok(()),
                Some(path) => Err(format!(
                    "{GUEST_KERNEL_ENV}={} is not a file",
                    path.display()
                )),
                None => Err(format!("{GUEST_KERNEL_ENV} is not set")),
            },
        }
    }

    /// How to provide the capability.
    pub fn remedy(self) -> String {
        match self {
            Capability::Root => {
                "run the tests as root (`sudo -E cargo test -- --include-ignored`, \
                                 or scripts/test.sh)"
                    .to_owned()
            }
            Capability::Tun => "load the tun module (`modprobe tun`); in a container, pass \
                                `--device /dev/net/tun`"
                .to_owned(),
            Capability::KernelVenv => format!(
                "`python3 -m venv {DEFAULT_KERNEL_VENV} && {DEFAULT_KERNEL_VENV}/bin/pip install \
                 -r crates/agent/tests/kernel-requirements.txt`, or point {KERNEL_VENV_ENV} at \
                 such a venv (scripts/test.sh builds one)"
            ),
            Capability::Postgres => {
                format!("`export {POSTGRES_ENV}=$(.ci/postgres.sh)` (scripts/test.sh does)")
            }
            Capability::ExtraCaBundle => format!(
                "point {EXTRA_CA_ENV} at a PEM CA bundle, e.g. a TLS-inspecting proxy's CA \
                 (scripts/test.sh generates a throwaway one)"
            ),
            Capability::Criu => format!(
                "build CRIU 4.2+ with `scripts/criu.sh` and point {CRIU_ENV} at the path it \
                 prints (Debian 12's criu 3.17 does not work on kernels >= 6.x)"
            ),
            Capability::Qemu => "`apt-get install qemu-system-x86`".to_owned(),
            Capability::GuestKernel => format!(
                "`export {GUEST_KERNEL_ENV}=$(scripts/guest-kernel.sh)/bzImage` (scripts/test.sh \
                 does)"
            ),
        }
    }
}

/// Fails the calling test, naming every missing capability and its remedy, unless the host has
/// them all. `#[requires]` calls it; call it directly only where a test's needs are dynamic.
#[track_caller]
pub fn require(caps: &[Capability]) {
    let missing: Vec<String> = caps
        .iter()
        .filter_map(|&c| {
            c.check()
                .err()
                .map(|why| format!("  - {}: {why}.\n    Fix: {}.", c.describe(), c.remedy()))
        })
        .collect();
    if !missing.is_empty() {
        fail(&missing.join("\n"));
    }
}

/// Like [`require`] for a need only the caller can probe: fails the test when `problems` is
/// not empty. `what` names the need ("a host the jail driver supports"), `remedy` the fix.
#[track_caller]
pub fn require_host<S: AsRef<str>>(what: &str, problems: &[S], remedy: &str) {
    if problems.is_empty() {
        return;
    }
    let why: Vec<&str> = problems.iter().map(AsRef::as_ref).collect();
    missing(what, &why.join("; "), remedy);
}

/// Fails the test because the host lacks `what` (found out by the test itself, e.g. a build
/// that could not reach its mirror), saying `why` and the `remedy`.
#[track_caller]
pub fn missing(what: &str, why: &str, remedy: &str) -> ! {
    fail(&format!("  - {what}: {why}.\n    Fix: {remedy}."))
}

#[track_caller]
fn fail(details: &str) -> ! {
    panic!(
        "This test needs what this host lacks, so it fails instead of passing untested:\n\
         {details}\n\
         (Plain `cargo test` reports it as ignored; `--include-ignored`, as scripts/test.sh \
         and CI run it, makes a missing capability a failure.)"
    )
}

/// The kernel venv's directory: `BULKHEAD_TEST_KERNEL_VENV`, else [`DEFAULT_KERNEL_VENV`].
/// Fails the test when it has no working kernels.
#[track_caller]
pub fn kernel_venv() -> PathBuf {
    require(&[Capability::KernelVenv]);
    kernel_venv_dir()
}

/// `BULKHEAD_TEST_POSTGRES_URL`; fails the test when it is not set.
#[track_caller]
pub fn postgres_url() -> String {
    require(&[Capability::Postgres]);
    std::env::var(POSTGRES_ENV).expect("checked by require")
}

/// `BULKHEAD_TEST_EXTRA_CA`; fails the test when it is not a readable file.
#[track_caller]
pub fn extra_ca_bundle() -> PathBuf {
    require(&[Capability::ExtraCaBundle]);
    PathBuf::from(std::env::var_os(EXTRA_CA_ENV).expect("checked by require"))
}

fn kernel_venv_dir() -> PathBuf {
    std::env::var_os(KERNEL_VENV_ENV)
        .map_or_else(|| PathBuf::from(DEFAULT_KERNEL_VENV), PathBuf::from)
}

fn open_rw(path: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(|_| ())
        .map_err(|e| format!("cannot open {path}: {e}"))
}

fn runs(program: &str, args: &[&str]) -> Result<(), String> {
    match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "`{program} {}` exited with {}",
            args.join(" "),
            o.status
        )),
        Err(e) => Err(format!("cannot run `{program}`: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capability_has_exactly_one_description() {
        for c in Capability::ALL {
            let name = format!("{c:?}");
            assert_eq!(
                CAPABILITIES.iter().filter(|(n, _)| *n == name).count(),
                1,
                "{name}"
            );
        }
        assert_eq!(CAPABILITIES.len(), Capability::ALL.len());
    }

    #[test]
    fn missing_capabilities_fail_with_the_remedy() {
        let err = std::panic::catch_unwind(|| {
            require_host("a thing", &["it is broken"], "mend it");
        })
        .unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("a thing: it is broken.") && msg.contains("Fix: mend it."),
            "{msg}"
        );
        require_host::<&str>("a thing", &[], "mend it");
    }

    #[test]
    fn a_check_that_fails_names_why() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(Capability::Root.check().is_ok(), root);
        if !root {
            let err = std::panic::catch_unwind(|| require(&[Capability::Root])).unwrap_err();
            let msg = err.downcast_ref::<String>().unwrap();
            assert!(msg.contains("not root") && msg.contains("sudo"), "{msg}");
        }
    }

    // The attribute itself, both test flavours (plain `cargo test` lists them as ignored).
    #[requires(Root)]
    #[test]
    fn requires_gates_a_plain_test() {
        assert!(Capability::Root.check().is_ok());
    }

    #[requires("nothing the host can lack")]
    #[test]
    fn requires_accepts_notes() {}
}
