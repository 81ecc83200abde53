//! The built-in templates: `base` (Debian bookworm `minbase` plus what agents expect) and
//! `code-interpreter-v1` (the kernels of E2B's code interpreter, layered on `base`). Recipes are
//! plain data; this is the one place that knows which ones ship with Bulkhead.

use crate::interpreter;
use crate::recipe::TemplateRecipe;

impl TemplateRecipe {
    /// The default template: Debian bookworm `minbase` plus what agents expect to find.
    ///
    /// bash and coreutils are Essential (always in minbase) but listed because sandboxes rely on
    /// them; passwd (Priority: required) is in minbase already. `netbase` provides /etc/services
    /// and /etc/protocols, which socket libraries look up. No sudo: `root` is a separate user.
    pub fn base() -> Self {
        TemplateRecipe {
            id: "base".to_owned(),
            suite: "bookworm".to_owned(),
            packages: [
                "bash",
                "ca-certificates",
                "coreutils",
                "curl",
                "git",
                "iproute2",
                "less",
                "netbase",
                "procps",
                "python3",
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
            packages: interpreter::DEBIAN_PACKAGES
                .iter()
                .map(|s| s.to_string())
                .collect(),
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
    use crate::interpreter::{KERNELS_JSON, REMOVE_EXTERNALLY_MANAGED, STARTUP, TEMPLATE_ID};
    use crate::recipe::{BuildStep, debian_arch};

    /// The image cache (/var/cache/bulkhead/images) is keyed by these hashes and a rebuild
    /// takes minutes: changing one is only right together with a deliberate change of the
    /// recipe, `FINALIZE_VERSION` or `LAYER_VERSION`.
    #[test]
    fn builtin_hashes_are_pinned() {
        if debian_arch() == "amd64" {
            assert_eq!(
                TemplateRecipe::base().content_hash(),
                "c41be0a75d173f45c2ca033944c8320e4a4e088d05c520e1cbf080f95d67f394",
                "base recipe hash changed"
            );
            assert_eq!(
                TemplateRecipe::code_interpreter().content_hash(),
                "e68746b9e1910b04eed4f566f9873b8f255cdc5a619483e05642e2e87c97f9de",
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
        // EXTERNALLY-MANAGED goes before pip runs, or pip refuses to install.
        let rm = r.steps.iter().position(|s| {
            *s == BuildStep::Run {
                command: REMOVE_EXTERNALLY_MANAGED.into(),
            }
        });
        let pip = r
            .steps
            .iter()
            .position(|s| matches!(s, BuildStep::Pip { .. }));
        assert!(rm.unwrap() < pip.unwrap());
        assert_eq!(TemplateRecipe::builtin(TEMPLATE_ID), Some(r));
    }
}
