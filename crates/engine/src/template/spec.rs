//! What a template build is made of (data only): the parent, the steps the SDK sends, the
//! user/workdir/env state they change, each step's cache key and the shell script a step runs
//! in its build sandbox. No I/O here, so the cache-key rules are unit-tested without root.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The E2B step kinds (`InstructionType` in the SDKs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    Copy,
    Run,
    Env,
    Workdir,
    User,
}

impl StepKind {
    pub fn parse(s: &str) -> Option<StepKind> {
        Some(match s {
            "COPY" => StepKind::Copy,
            "RUN" => StepKind::Run,
            "ENV" => StepKind::Env,
            "WORKDIR" => StepKind::Workdir,
            "USER" => StepKind::User,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Copy => "COPY",
            StepKind::Run => "RUN",
            StepKind::Env => "ENV",
            StepKind::Workdir => "WORKDIR",
            StepKind::User => "USER",
        }
    }
}

/// One build step as the SDK sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildStep {
    pub kind: StepKind,
    pub args: Vec<String>,
    /// COPY: the SDK's hash of the files (and the uploaded archive's name in the file store).
    pub files_hash: Option<String>,
    /// Rebuild this step (and so every later one) instead of taking it from the cache.
    pub force: bool,
}

impl BuildStep {
    /// A one-line description for the build log (`RUN pip install x`).
    pub fn describe(&self) -> String {
        match self.kind {
            StepKind::Env => {
                let pairs: Vec<String> = self
                    .args
                    .chunks(2)
                    .map(|kv| format!("{}={}", kv[0], kv.get(1).map_or("", String::as_str)))
                    .collect();
                format!("ENV {}", pairs.join(" "))
            }
            _ => format!("{} {}", self.kind.as_str(), self.args.join(" "))
                .trim_end()
                .to_owned(),
        }
    }

    /// Does this step change the tree (and so run in a build sandbox)? ENV and USER only change
    /// what later steps and sandboxes run with.
    pub fn changes_tree(&self) -> bool {
        matches!(
            self.kind,
            StepKind::Copy | StepKind::Run | StepKind::Workdir
        )
    }

    /// Checks the arguments the way the SDKs build them; the message names the step.
    pub fn validate(&self, index: usize) -> Result<(), StepSpecError> {
        let step = index + 1;
        let need = |min: usize| {
            if self.args.len() < min {
                Err(StepSpecError::TooFewArgs {
                    step,
                    kind: self.kind.as_str(),
                    min,
                    got: self.args.len(),
                })
            } else {
                Ok(())
            }
        };
        match self.kind {
            StepKind::Copy => {
                need(2)?;
                let hash = self.files_hash.as_deref().unwrap_or("");
                if !valid_files_hash(hash) {
                    return Err(StepSpecError::NoFilesHash { step });
                }
                if let Some(mode) = self.args.get(3).filter(|m| !m.is_empty())
                    && u32::from_str_radix(mode, 8).map_or(true, |m| m > 0o7777)
                {
                    return Err(StepSpecError::BadMode {
                        step,
                        mode: mode.clone(),
                    });
                }
                Ok(())
            }
            StepKind::Run | StepKind::Workdir | StepKind::User => need(1),
            StepKind::Env => {
                if !self.args.len().is_multiple_of(2) {
                    return Err(StepSpecError::OddEnv { step });
                }
                Ok(())
            }
        }
    }
}

/// Why a build step's arguments were refused, one variant per rule of
/// [`BuildStep::validate`]. `step` counts from 1, as the message shows it; the text is the
/// 400 answer's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepSpecError {
    #[error("step {step} ({kind}) needs at least {min} argument(s), got {got}")]
    TooFewArgs {
        step: usize,
        kind: &'static str,
        min: usize,
        got: usize,
    },
    #[error("step {step} (COPY) has no valid filesHash: upload its files first")]
    NoFilesHash { step: usize },
    #[error("step {step} (COPY): mode {mode:?} is not octal")]
    BadMode { step: usize, mode: String },
    #[error("step {step} (ENV) needs key/value pairs")]
    OddEnv { step: usize },
}

/// The SDKs' files hash: a sha256 hex digest.
pub fn valid_files_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What steps run with, changed by USER/WORKDIR/ENV and stored with the template for its
/// sandboxes (E2B: the last user and workdir become the sandbox's defaults).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunState {
    pub user: String,
    /// None: the user's home directory.
    pub workdir: Option<String>,
    pub envs: BTreeMap<String, String>,
}

impl Default for RunState {
    /// E2B's defaults: user `user` in `/home/user`.
    fn default() -> Self {
        RunState {
            user: "user".into(),
            workdir: None,
            envs: BTreeMap::new(),
        }
    }
}

impl RunState {
    /// Applies a metadata step (ENV, USER, WORKDIR's directory).
    pub fn apply(&mut self, step: &BuildStep) {
        match step.kind {
            StepKind::Env => {
                for kv in step.args.chunks(2) {
                    self.envs
                        .insert(kv[0].clone(), kv.get(1).cloned().unwrap_or_default());
                }
            }
            StepKind::User => self.user = step.args[0].clone(),
            StepKind::Workdir => self.workdir = Some(self.resolve(&step.args[0])),
            StepKind::Copy | StepKind::Run => {}
        }
    }

    /// A path relative to the workdir made absolute (`~` for the user's home is left to the
    /// shell when no workdir is set).
    pub fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') {
            return path.to_owned();
        }
        match &self.workdir {
            Some(w) => format!("{}/{}", w.trim_end_matches('/'), path),
            None => format!("~{}/{path}", self.user),
        }
    }
}

/// The key of the tree before any step: the parent template's content.
pub fn base_key(parent_content_hash: &str) -> String {
    digest(&["bulkhead template build v1", parent_content_hash])
}

/// The key of the tree (and state) after `step`, from the key before it. A forced step gets a
/// key of its own (salted with the build), so it runs again and every later step follows it,
/// while the unforced layer stays cached for other builds.
pub fn step_key(prev: &str, step: &BuildStep, force_salt: Option<&str>) -> String {
    let mut parts: Vec<&str> = vec![prev, step.kind.as_str()];
    let n = step.args.len().to_string();
    parts.push(&n);
    parts.extend(step.args.iter().map(String::as_str));
    parts.push(step.files_hash.as_deref().unwrap_or("-"));
    if let Some(salt) = force_salt {
        parts.push("force");
        parts.push(salt);
    }
    digest(&parts)
}

fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        // Length-prefixed, so ("ab","c") and ("a","bc") differ.
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Single-quotes `s` for bash.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Where a COPY step's archive is put inside the build sandbox (tmpfs: not part of the layer).
pub fn archive_path(files_hash: &str) -> String {
    format!("/tmp/.bulkhead-build/{files_hash}.tar")
}

/// The script a tree-changing step runs (as root for COPY and WORKDIR, as the step's user for
/// RUN) and the user it runs as.
pub fn step_script(step: &BuildStep, state: &RunState) -> (String, String) {
    match step.kind {
        StepKind::Run => {
            let user = step
                .args
                .get(1)
                .filter(|u| !u.is_empty())
                .cloned()
                .unwrap_or_else(|| state.user.clone());
            (step.args[0].clone(), user)
        }
        StepKind::Workdir => {
            let dir = state.resolve(&step.args[0]);
            let script = format!(
                "d={dir}\n[ -d \"$d\" ] || {{ mkdir -p \"$d\" && chown {user}: \"$d\"; }}",
                dir = shell_path(&dir),
                user = shell_quote(&state.user),
            );
            (script, "root".into())
        }
        StepKind::Copy => (copy_script(step, state), "root".into()),
        StepKind::Env | StepKind::User => (String::new(), state.user.clone()),
    }
}

/// A path for the shell: `~user/...` stays unquoted up to the first slash so it expands.
fn shell_path(p: &str) -> String {
    match p.strip_prefix('~') {
        Some(rest) => {
            let (user, tail) = rest.split_once('/').unwrap_or((rest, ""));
            format!("~{user}/{}", shell_quote(tail))
        }
        None => shell_quote(p),
    }
}

/// COPY as Docker does it: the archive (paths relative to the build context) is unpacked in a
/// scratch directory; one directory source copies its contents, one file source to a path not
/// ending in `/` becomes that path, anything else goes into `dest/`. Owner: the step's `user`
/// argument, else the current user; mode, when given, on everything copied.
fn copy_script(step: &BuildStep, state: &RunState) -> String {
    let hash = step.files_hash.as_deref().unwrap_or_default();
    let owner = step
        .args
        .get(2)
        .filter(|u| !u.is_empty())
        .cloned()
        .unwrap_or_else(|| state.user.clone());
    let owner = if owner.contains(':') {
        owner
    } else {
        format!("{owner}:")
    };
    let mode = step.args.get(3).cloned().unwrap_or_default();
    let dest = state.resolve(&step.args[1]);
    format!(
        r#"set -e
shopt -s globstar dotglob nullglob
SRC={src}
DEST={dest}
OWNER={owner}
MODE={mode}
ctx=$(mktemp -d /tmp/.bulkhead-build/ctx.XXXXXX)
tar -xf {archive} -C "$ctx" --no-same-owner
cd "$ctx"
IFS=$'\n'
matches=( $SRC )
unset IFS
if [ ${{#matches[@]}} -eq 0 ]; then echo "COPY: no files match $SRC" >&2; exit 1; fi
targets=()
if [ ${{#matches[@]}} -eq 1 ] && [ -d "${{matches[0]}}" ] && [ ! -L "${{matches[0]}}" ]; then
  mkdir -p "$DEST"
  for e in "${{matches[0]}}"/*; do cp -a "$e" "$DEST/"; targets+=("$DEST/$(basename "$e")"); done
elif [ ${{#matches[@]}} -eq 1 ] && [[ "$DEST" != */ ]] && [ ! -d "$DEST" ]; then
  mkdir -p "$(dirname "$DEST")"
  cp -a "${{matches[0]}}" "$DEST"
  targets+=("$DEST")
else
  mkdir -p "$DEST"
  for m in "${{matches[@]}}"; do cp -a "$m" "$DEST/"; targets+=("$DEST/$(basename "$m")"); done
fi
for t in "${{targets[@]}}"; do
  chown -hR "$OWNER" "$t"
  if [ -n "$MODE" ] && [ ! -L "$t" ]; then chmod -R "$MODE" "$t"; fi
done
rm -rf "$ctx"
"#,
        src = shell_quote(&step.args[0]),
        dest = shell_path(&dest),
        owner = shell_quote(&owner),
        mode = shell_quote(&mode),
        archive = shell_quote(&archive_path(hash)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cmd: &str) -> BuildStep {
        BuildStep {
            kind: StepKind::Run,
            args: vec![cmd.into()],
            files_hash: None,
            force: false,
        }
    }

    #[test]
    fn keys_chain_so_one_changed_step_changes_it_and_every_later_key_only() {
        let b = base_key("parent-hash");
        let steps_a = [run("echo 1"), run("echo 2"), run("echo 3")];
        let steps_b = [run("echo 1"), run("echo CHANGED"), run("echo 3")];
        let keys = |steps: &[BuildStep]| {
            let mut k = b.clone();
            steps
                .iter()
                .map(|s| {
                    k = step_key(&k, s, None);
                    k.clone()
                })
                .collect::<Vec<_>>()
        };
        let (ka, kb) = (keys(&steps_a), keys(&steps_b));
        assert_eq!(ka[0], kb[0], "the unchanged first step is reused");
        assert_ne!(ka[1], kb[1]);
        assert_ne!(
            ka[2], kb[2],
            "a later identical step sits on a different tree"
        );
        // Same input, same key; another parent, other keys.
        assert_eq!(ka, keys(&steps_a));
        assert_ne!(step_key(&base_key("other"), &steps_a[0], None), ka[0]);
    }

    #[test]
    fn files_hash_and_force_are_part_of_the_key() {
        let b = base_key("p");
        let mut c = BuildStep {
            kind: StepKind::Copy,
            args: vec!["a.txt".into(), "/app/".into(), String::new(), String::new()],
            files_hash: Some("a".repeat(64)),
            force: false,
        };
        let k1 = step_key(&b, &c, None);
        c.files_hash = Some("b".repeat(64));
        assert_ne!(k1, step_key(&b, &c, None), "changed file contents rebuild");
        assert_ne!(step_key(&b, &c, None), step_key(&b, &c, Some("build-1")));
        assert_ne!(
            step_key(&b, &c, Some("build-1")),
            step_key(&b, &c, Some("build-2"))
        );
        // Argument boundaries count: ["ab", "c"] is not ["a", "bc"].
        let x = BuildStep {
            kind: StepKind::Run,
            args: vec!["ab".into(), "c".into()],
            files_hash: None,
            force: false,
        };
        let y = BuildStep {
            args: vec!["a".into(), "bc".into()],
            ..x.clone()
        };
        assert_ne!(step_key(&b, &x, None), step_key(&b, &y, None));
    }

    #[test]
    fn state_follows_user_workdir_and_env_steps() {
        let mut s = RunState::default();
        assert_eq!(s.resolve("app"), "~user/app");
        s.apply(&BuildStep {
            kind: StepKind::Env,
            args: vec!["A".into(), "1".into(), "B".into(), "x y".into()],
            files_hash: None,
            force: false,
        });
        s.apply(&BuildStep {
            kind: StepKind::Workdir,
            args: vec!["/srv/app".into()],
            files_hash: None,
            force: false,
        });
        s.apply(&BuildStep {
            kind: StepKind::User,
            args: vec!["root".into()],
            files_hash: None,
            force: false,
        });
        assert_eq!(s.envs["B"], "x y");
        assert_eq!(s.resolve("data"), "/srv/app/data");
        assert_eq!(s.user, "root");
        let (script, user) = step_script(&run("whoami"), &s);
        assert_eq!((script.as_str(), user.as_str()), ("whoami", "root"));
    }

    #[test]
    fn validation_names_the_step() {
        let bad = BuildStep {
            kind: StepKind::Copy,
            args: vec!["a".into(), "/b".into()],
            files_hash: Some("zz".into()),
            force: false,
        };
        assert_eq!(bad.validate(2), Err(StepSpecError::NoFilesHash { step: 3 }));
        assert_eq!(
            bad.validate(2).unwrap_err().to_string(),
            "step 3 (COPY) has no valid filesHash: upload its files first"
        );
        let short = BuildStep {
            kind: StepKind::Run,
            args: vec![],
            files_hash: None,
            force: false,
        };
        assert_eq!(
            short.validate(0).unwrap_err().to_string(),
            "step 1 (RUN) needs at least 1 argument(s), got 0"
        );
        let mode = BuildStep {
            args: vec!["a".into(), "/b".into(), "".into(), "0999".into()],
            files_hash: Some("a".repeat(64)),
            ..bad.clone()
        };
        assert_eq!(
            mode.validate(0).unwrap_err().to_string(),
            r#"step 1 (COPY): mode "0999" is not octal"#
        );
        let env = BuildStep {
            kind: StepKind::Env,
            args: vec!["A".into()],
            files_hash: None,
            force: false,
        };
        assert_eq!(
            env.validate(4).unwrap_err().to_string(),
            "step 5 (ENV) needs key/value pairs"
        );
        assert!(StepKind::parse("FROM").is_none());
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_path("~user/a b"), "~user/'a b'");
    }
}
