//! The built-in templates: `base` (Debian bookworm `minbase` plus what agents expect) and
//! `code-interpreter-v1` (the kernels of E2B's code interpreter, layered on `base`). Recipes are
//! plain data; this is the one place that knows which ones ship with Bulkhead.

use crate::interpreter;
use crate::nodejs;
use crate::recipe::{BuildStep, FileAsset, TemplateRecipe};

/// Debian marks its Python "externally managed"; E2B sandboxes let `pip install x` work, so the
/// marker goes (pip then installs system-wide as root, into the user site as `user`).
pub(crate) const REMOVE_EXTERNALLY_MANAGED: &str = "rm -f /usr/lib/python3*/EXTERNALLY-MANAGED";

/// `user` may become root with `sudo` without a password, as on E2B.
const SUDOERS: &str = "/etc/sudoers.d/user";
const SUDOERS_RULE: &str = "user ALL=(ALL:ALL) NOPASSWD: ALL\n";

/// Every command runs in a login shell (`bash -l -c`, as E2B's envd does), so Debian's profile
/// runs on every command: its `$(id -u)` and root's `mesg n` are a fork and an exec each, about
/// a millisecond of CPU per command on our hosts. bash has `$EUID` and `[ -t 0 ]` built in; the
/// result is the same (dash, which lacks `EUID`, still asks `id`). `grep` fails the build if
/// Debian changes the lines, instead of silently keeping the slow ones.
const CHEAP_LOGIN_SHELL: &str = r#"sed -i 's/^if \[ "$(id -u)" -eq 0 \]; then$/if [ "${EUID:-$(id -u)}" -eq 0 ]; then/' /etc/profile
grep -qF '"${EUID:-$(id -u)}"' /etc/profile
sed -i 's/^mesg n 2> \/dev\/null || true$/[ -t 0 ] \&\& mesg n 2> \/dev\/null || true/' /root/.profile
grep -qF '[ -t 0 ] && mesg n' /root/.profile"#;

impl TemplateRecipe {
    /// The Debian layer under `base`: bookworm `minbase` plus the Debian packages of E2B's
    /// `base` (the `python:3.11` image's: Python 3.11 with pip, venv and headers,
    /// `build-essential`, git, curl, wget, unzip) and `sudo` and `gh`. Not served as a template
    /// of its own; kept as a separate layer so the bootstrap tools are tested on it alone.
    ///
    /// bash and coreutils are Essential (always in minbase) but listed because sandboxes rely on
    /// them; passwd (Priority: required) is in minbase already. `netbase` provides /etc/services
    /// and /etc/protocols, which socket libraries look up.
    pub fn debian() -> Self {
        TemplateRecipe {
            id: "debian-bookworm".to_owned(),
            suite: "bookworm".to_owned(),
            packages: [
                "bash",
                "build-essential",
                "ca-certificates",
                "coreutils",
                "curl",
                "gh",
                "git",
                "iproute2",
                "less",
                "netbase",
                "procps",
                "python-is-python3",
                "python3",
                "python3-dev",
                "python3-pip",
                "python3-venv",
                "sudo",
                "unzip",
                "wget",
                "xz-utils",
                "zip",
            ]
            .into_iter()
            .map(str::to_owned)
            .collect(),
            extra_ca_bundle: None,
            recipe_version: 1,
            parent: None,
            steps: Vec::new(),
        }
    }

    /// The default template, what E2B's `base` has: [`debian`](Self::debian) plus Node.js 20
    /// (the official build), npm and yarn; `pip install` allowed system-wide (Debian's
    /// "externally managed" marker removed, as in the `python` images); `user` may use `sudo`
    /// without a password (inside the sandbox that grants nothing beyond the sandbox's own root,
    /// which the API hands out anyway).
    pub fn base() -> Self {
        let debian = TemplateRecipe::debian();
        TemplateRecipe {
            id: "base".to_owned(),
            suite: debian.suite.clone(),
            packages: Vec::new(),
            extra_ca_bundle: None,
            recipe_version: 1,
            parent: Some(Box::new(debian)),
            steps: vec![
                BuildStep::Run {
                    command: REMOVE_EXTERNALLY_MANAGED.to_owned(),
                },
                BuildStep::Run {
                    command: nodejs::install_script(),
                },
                BuildStep::Npm {
                    packages: vec![nodejs::YARN.to_owned()],
                },
                BuildStep::File(FileAsset::new(SUDOERS, SUDOERS_RULE, 0o440)),
                BuildStep::Run {
                    command: CHEAP_LOGIN_SHELL.to_owned(),
                },
            ],
        }
    }

    /// The built-in templates, by id.
    pub fn builtin(id: &str) -> Option<Self> {
        match id {
            "base" => Some(Self::base()),
            interpreter::TEMPLATE_ID => Some(Self::code_interpreter()),
            _ => None,
        }
    }

    /// Ids accepted by [`builtin`](Self::builtin).
    pub fn builtin_ids() -> &'static [&'static str] {
        &["base", interpreter::TEMPLATE_ID]
    }

    /// `code-interpreter-v1`: [`base`](Self::base) plus the kernels of E2B's code interpreter.
    pub fn code_interpreter() -> Self {
        let base = TemplateRecipe::base();
        TemplateRecipe {
            id: interpreter::TEMPLATE_ID.to_owned(),
            suite: base.suite.clone(),
            packages: Vec::new(),
            extra_ca_bundle: None,
            recipe_version: 1,
            parent: Some(Box::new(base)),
            steps: interpreter::layer_steps(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::{KERNELS_JSON, STARTUP, TEMPLATE_ID};
    use crate::recipe::{BuildStep, debian_arch};

    /// The image cache (/var/cache/bulkhead/images) is keyed by these hashes and a rebuild
    /// takes minutes: changing one is only right together with a deliberate change of the
    /// recipe, `FINALIZE_VERSION` or `LAYER_VERSION`.
    #[test]
    fn builtin_hashes_are_pinned() {
        if debian_arch() == "amd64" {
            assert_eq!(
                TemplateRecipe::base().content_hash(),
                "f811236fd8588fc072b7c5342042bbc5bcd5d8317ea570a990cbad9e11777033",
                "base recipe hash changed"
            );
            assert_eq!(
                TemplateRecipe::code_interpreter().content_hash(),
                "c6e6ac948dbdc1d8da70d40690430353b10afc50d7a8e422738fa2970ae74258",
                "code-interpreter-v1 recipe hash changed"
            );
        }
        assert_eq!(TemplateRecipe::base().content_hash().len(), 64);
        assert_eq!(TemplateRecipe::code_interpreter().content_hash().len(), 64);
    }

    #[test]
    fn builtins_by_id() {
        for id in TemplateRecipe::builtin_ids() {
            let r = TemplateRecipe::builtin(id).unwrap();
            assert_eq!(r.id, *id);
            r.validate().unwrap();
        }
        assert_eq!(
            TemplateRecipe::builtin("base"),
            Some(TemplateRecipe::base())
        );
        assert_eq!(TemplateRecipe::builtin("nope"), None);
    }

    #[test]
    fn recipe_is_valid_and_layered_on_base() {
        let r = TemplateRecipe::code_interpreter();
        r.validate().unwrap();
        assert_eq!(r.id, "code-interpreter-v1");
        assert_eq!(r.parent.as_deref(), Some(&TemplateRecipe::base()));
        let files: Vec<&str> = r
            .steps
            .iter()
            .filter_map(|s| match s {
                BuildStep::File(f) => Some(f.path()),
                _ => None,
            })
            .collect();
        assert!(files.contains(&KERNELS_JSON));
        assert!(files.contains(&STARTUP));
        // pip and npm come with base: nothing from Debian on top.
        assert!(r.packages.is_empty());
        assert_eq!(TemplateRecipe::builtin(TEMPLATE_ID), Some(r));
    }

    #[test]
    fn base_is_e2b_base_on_the_debian_layer() {
        let base = TemplateRecipe::base();
        base.validate().unwrap();
        let debian = base.parent.as_deref().expect("base is layered");
        assert_eq!(debian, &TemplateRecipe::debian());
        for p in [
            "build-essential",
            "python3-pip",
            "python3-venv",
            "sudo",
            "git",
            "curl",
        ] {
            assert!(debian.packages.iter().any(|x| x == p), "{p}");
        }
        // EXTERNALLY-MANAGED goes before anything installs with pip (here or in a child).
        assert_eq!(
            base.steps[0],
            BuildStep::Run {
                command: REMOVE_EXTERNALLY_MANAGED.into()
            }
        );
        // Node.js (with npm) before the npm step that needs it.
        let node = base.steps.iter().position(
            |s| matches!(s, BuildStep::Run { command } if command.contains("node-linux-")),
        );
        let npm = base
            .steps
            .iter()
            .position(|s| matches!(s, BuildStep::Npm { .. }));
        assert!(node.unwrap() < npm.unwrap());
        let sudoers = base.steps.iter().find_map(|s| match s {
            BuildStep::File(f) if f.path() == SUDOERS => Some(f),
            _ => None,
        });
        let sudoers = sudoers.expect("sudoers rule");
        assert_eq!(
            sudoers.mode(),
            0o440,
            "sudo ignores group/world-writable rules"
        );
        assert_eq!(sudoers.contents(), b"user ALL=(ALL:ALL) NOPASSWD: ALL\n");
    }
}
