//! The steps of a layered template, as data: what each one installs or writes, its validation
//! (exact pins only), and the shell command it stands for. Running them is `layer`'s job.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ImageError, Result};

/// One step of a layered template, run in order after the extra Debian packages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BuildStep {
    /// `pip install` of exact pins (`name==version`) into the system Python (/usr/local).
    Pip { packages: Vec<String> },
    /// `npm install -g` of exact pins (`name@version`, `@scope/name@version`).
    Npm { packages: Vec<String> },
    /// A shell command (`/bin/sh -ec`) run as root inside the tree.
    Run { command: String },
    /// A file written into the tree (root-owned, parent directories 0755).
    File(FileAsset),
}

/// A file to place in the tree. The serialised form (used for the hash and in `READY`) carries
/// the contents' SHA-256, not the contents, so the metadata stays small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAsset {
    path: String,
    mode: u32,
    sha256: String,
    #[serde(skip)]
    contents: Vec<u8>,
}

impl FileAsset {
    /// `path` is absolute inside the tree, e.g. `/opt/bulkhead/interpreter/kernels.json`.
    pub fn new(path: impl Into<String>, contents: impl Into<Vec<u8>>, mode: u32) -> Self {
        let contents = contents.into();
        FileAsset {
            path: path.into(),
            mode,
            sha256: sha256_hex(&contents),
            contents,
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn mode(&self) -> u32 {
        self.mode
    }

    pub fn contents(&self) -> &[u8] {
        &self.contents
    }

    pub(crate) fn validate(&self) -> Result<()> {
        // Checked on the string: `Path::components` would silently drop `.` segments.
        let normal = self.path.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        });
        if !normal {
            return Err(ImageError::InvalidRecipe(format!(
                "file path {:?} must be absolute without `.`/`..` components",
                self.path
            )));
        }
        if self.mode > 0o7777 {
            return Err(ImageError::InvalidRecipe(format!(
                "file {} has mode {:o}, which is not a permission mode",
                self.path, self.mode
            )));
        }
        if sha256_hex(&self.contents) != self.sha256 {
            // Happens for a recipe read back from `READY`: only the digest was stored.
            return Err(ImageError::InvalidRecipe(format!(
                "the contents of {} are missing (a recipe read from build metadata cannot be \
                 rebuilt; use the built-in recipe)",
                self.path
            )));
        }
        Ok(())
    }
}

impl BuildStep {
    /// Short description for progress output.
    pub fn describe(&self) -> String {
        match self {
            BuildStep::Pip { packages } => {
                format!("pip install ({} pinned packages)", packages.len())
            }
            BuildStep::Npm { packages } => format!("npm install -g {}", packages.join(" ")),
            // Multi-line scripts are named by their first line.
            BuildStep::Run { command } => {
                format!("run: {}", command.lines().next().unwrap_or_default())
            }
            BuildStep::File(f) => format!("write {} ({} bytes)", f.path, f.contents.len()),
        }
    }

    /// The shell command that performs the step inside the tree, or None for steps done from
    /// the host (files).
    pub fn render(&self) -> Option<String> {
        match self {
            BuildStep::Pip { packages } => Some(format!(
                "python3 -m pip install --no-cache-dir --no-input --disable-pip-version-check \
                 --root-user-action=ignore --progress-bar off --prefer-binary {}",
                quote_all(packages)
            )),
            BuildStep::Npm { packages } => Some(format!(
                "npm install --global --no-fund --no-audit --no-update-notifier --loglevel=http {}",
                quote_all(packages)
            )),
            BuildStep::Run { command } => Some(command.clone()),
            BuildStep::File(_) => None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        match self {
            BuildStep::Pip { packages } => check_pins(packages, "pip", is_pip_pin),
            BuildStep::Npm { packages } => check_pins(packages, "npm", is_npm_pin),
            BuildStep::Run { command } => {
                if command.trim().is_empty() {
                    Err(ImageError::InvalidRecipe("empty `run` step".into()))
                } else {
                    Ok(())
                }
            }
            BuildStep::File(f) => f.validate(),
        }
    }
}

fn check_pins(packages: &[String], tool: &str, ok: fn(&str) -> bool) -> Result<()> {
    if packages.is_empty() {
        return Err(ImageError::InvalidRecipe(format!("empty {tool} step")));
    }
    for p in packages {
        if !ok(p) {
            let shape = if tool == "pip" {
                "name==version"
            } else {
                "name@version"
            };
            return Err(ImageError::InvalidRecipe(format!(
                "{tool} package {p:?} is not pinned to an exact version ({shape})"
            )));
        }
    }
    Ok(())
}

/// `name==version` (PEP 508 name, PEP 440-ish version), nothing else (no ranges, URLs, extras).
pub(crate) fn is_pip_pin(p: &str) -> bool {
    let Some((name, version)) = p.split_once("==") else {
        return false;
    };
    !name.is_empty()
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && is_version(version, b"!+")
}

/// `name@version` or `@scope/name@version` with an exact version (no ranges or tags).
pub(crate) fn is_npm_pin(p: &str) -> bool {
    let (scoped, rest) = match p.strip_prefix('@') {
        Some(r) => (true, r),
        None => (false, p),
    };
    let Some((name, version)) = rest.rsplit_once('@') else {
        return false;
    };
    let name_ok = |n: &str| {
        !n.is_empty()
            && !n.starts_with('.')
            && n.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    };
    let names_ok = if scoped {
        matches!(name.split_once('/'), Some((s, n)) if name_ok(s) && name_ok(n))
    } else {
        name_ok(name)
    };
    names_ok
        && version.as_bytes()[..]
            .first()
            .is_some_and(u8::is_ascii_digit)
        && is_version(version, b"+")
}

fn is_version(v: &str, extra: &[u8]) -> bool {
    !v.is_empty()
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-') || extra.contains(&b))
}

/// Single-quotes each word for /bin/sh (pins are validated, but quoting keeps `!` and the like
/// literal regardless).
fn quote_all(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// SHA-256 (hex) of `bytes`: file assets are hashed by content, and so are recipes.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins() {
        for ok in [
            "numpy==2.4.6",
            "bash_kernel==0.10.0",
            "certifi==2026.10.18",
            "a.b-c==1!2.0+local",
        ] {
            assert!(is_pip_pin(ok), "{ok}");
        }
        for bad in [
            "numpy",
            "numpy>=2",
            "numpy==",
            "==1",
            "numpy==2; rm -rf /",
            "x==1 y==2",
            "-e==1",
        ] {
            assert!(!is_pip_pin(bad), "{bad}");
        }
        for ok in [
            "deno@2.9.6",
            "@types/node@18.19.130",
            "left-pad@1.3.0-rc.1+build",
        ] {
            assert!(is_npm_pin(ok), "{ok}");
        }
        for bad in [
            "deno",
            "deno@latest",
            "deno@^2",
            "@types@1.0.0",
            "Deno@1.0.0",
            "x@1 y@2",
            "@/x@1",
        ] {
            assert!(!is_npm_pin(bad), "{bad}");
        }
    }

    #[test]
    fn renders_steps() {
        let pip = BuildStep::Pip {
            packages: vec!["numpy==2.4.6".into(), "duckdb==2.0.0".into()],
        };
        let cmd = pip.render().unwrap();
        assert!(
            cmd.starts_with("python3 -m pip install --no-cache-dir"),
            "{cmd}"
        );
        assert!(cmd.ends_with(" 'numpy==2.4.6' 'duckdb==2.0.0'"), "{cmd}");
        let npm = BuildStep::Npm {
            packages: vec!["deno@2.9.6".into()],
        };
        assert_eq!(
            npm.render().unwrap(),
            "npm install --global --no-fund --no-audit --no-update-notifier --loglevel=http 'deno@2.9.6'"
        );
        let run = BuildStep::Run {
            command: "rm -f /x".into(),
        };
        assert_eq!(run.render().unwrap(), "rm -f /x");
        let file = BuildStep::File(FileAsset::new("/opt/a", "x", 0o644));
        assert_eq!(file.render(), None);
        assert_eq!(quote_all(&["it's".to_owned()]), r"'it'\''s'");
    }

    #[test]
    fn validates_steps() {
        BuildStep::File(FileAsset::new("/opt/bulkhead/a.json", "{}", 0o644))
            .validate()
            .unwrap();
        for bad in ["relative/a", "/", "/opt/../etc/passwd", "/opt/./a"] {
            assert!(
                BuildStep::File(FileAsset::new(bad, "x", 0o644))
                    .validate()
                    .is_err(),
                "{bad}"
            );
        }
        assert!(
            BuildStep::File(FileAsset::new("/a", "x", 0o100644))
                .validate()
                .is_err()
        );
        assert!(BuildStep::Pip { packages: vec![] }.validate().is_err());
        assert!(
            BuildStep::Npm {
                packages: vec!["deno".into()]
            }
            .validate()
            .is_err()
        );
        assert!(
            BuildStep::Run {
                command: " ".into()
            }
            .validate()
            .is_err()
        );

        // Read back from READY: digest only, contents gone.
        let f = FileAsset::new("/opt/a", "contents", 0o644);
        let json = serde_json::to_string(&BuildStep::File(f)).unwrap();
        assert!(!json.contains("contents\""), "{json}");
        let back: BuildStep = serde_json::from_str(&json).unwrap();
        assert!(back.validate().is_err());
    }
}
