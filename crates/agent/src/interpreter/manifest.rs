//! `/opt/bulkhead/interpreter/kernels.json`: which Jupyter kernels the template ships and how to
//! start them (written by the template build, read once at agent start).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the template puts the manifest.
pub const DEFAULT_MANIFEST_PATH: &str = "/opt/bulkhead/interpreter/kernels.json";

/// The placeholder in `argv` that the agent replaces with the connection file's path.
pub const CONNECTION_FILE_PLACEHOLDER: &str = "{connection_file}";

/// Errors loading the manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file exists but cannot be read.
    #[error("Could not read the kernel manifest {path}")]
    Read {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The file is not valid JSON of the expected shape.
    #[error("The kernel manifest {path} is invalid (rebuild the template): {source}")]
    Parse {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// A version this agent does not understand.
    #[error(
        "The kernel manifest has version {0}; this agent understands version 1 (update the agent or rebuild the template)"
    )]
    Version(u32),
    /// A language without a command.
    #[error("The kernel manifest gives language {0:?} an empty argv")]
    EmptyArgv(String),
    /// A command that cannot be told where to connect.
    #[error(
        "The kernel manifest's argv for language {0:?} has no \"{{connection_file}}\" placeholder, so the kernel could not find its ports"
    )]
    NoConnectionFile(String),
    /// A default context for a language the manifest does not define.
    #[error("The kernel manifest lists {0:?} as a default context but defines no such language")]
    UnknownDefault(String),
}

/// How a kernel is interrupted (the kernelspec's `interrupt_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InterruptMode {
    /// SIGINT to the kernel's process group (Jupyter's default).
    #[default]
    Signal,
    /// An `interrupt_request` on the control channel.
    Message,
}

/// How the agent talks to a kernel: which snippets set environment variables and how user code is
/// wrapped. Defaults from the language name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// IPython.
    Python,
    /// A JavaScript kernel (Node's `process.env`).
    Javascript,
    /// A TypeScript kernel.
    Typescript,
    /// `bash_kernel`.
    Bash,
    /// IRkernel.
    R,
    /// A JShell-based Java kernel (JJava).
    Java,
    /// The Python kernel with the `bulkhead_sql` startup module: user code is passed to
    /// `_bulkhead_sql_run`.
    Sql,
    /// Anything else: code is sent as-is and environment variables are not supported.
    Other,
}

impl Dialect {
    /// The dialect a language name implies.
    pub fn for_language(language: &str) -> Self {
        match language {
            "python" => Self::Python,
            "javascript" => Self::Javascript,
            "typescript" => Self::Typescript,
            "bash" => Self::Bash,
            "r" => Self::R,
            "java" => Self::Java,
            "sql" => Self::Sql,
            _ => Self::Other,
        }
    }
}

/// One language's kernel.
#[derive(Debug, Clone, Deserialize)]
pub struct LanguageSpec {
    /// Command line; `{connection_file}` is replaced by the connection file's path.
    pub argv: Vec<String>,
    /// Variables merged over the sandbox environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Other names for the language (e.g. `js`).
    #[serde(default)]
    pub aliases: Vec<String>,
    /// How to interrupt the kernel.
    #[serde(default)]
    pub interrupt_mode: InterruptMode,
    /// Snippet dialect; by default from the language name.
    #[serde(default)]
    pub dialect: Option<Dialect>,
    /// Code run silently once the kernel is up, so the first user execution is fast; by default a
    /// no-op statement of the dialect.
    #[serde(default)]
    pub warmup: Option<String>,
    /// Milliseconds to wait after a cell went idle for late output of that cell; by default 20
    /// for Deno kernels (which publish results concurrently with idle) and 0 otherwise.
    #[serde(default)]
    pub settle_ms: Option<u64>,
    /// This language's default context is listed from the start, but its kernel starts on its
    /// first execution rather than with the agent: it then never runs in a warm sandbox that is
    /// checkpointed for a pool (Deno: V8's `Math.random` cannot be re-seeded in the clones).
    #[serde(default)]
    pub start_lazily: bool,
}

/// The manifest.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// Format version (1).
    pub version: u32,
    /// Languages whose default context starts with the agent.
    #[serde(default)]
    pub default_contexts: Vec<String>,
    /// Kernels by canonical language name.
    pub languages: BTreeMap<String, LanguageSpec>,
}

impl Manifest {
    /// Reads `path`; `Ok(None)` when it does not exist (the template has no interpreter).
    pub fn load(path: &Path) -> Result<Option<Self>, ManifestError> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(ManifestError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let manifest: Self =
            serde_json::from_slice(&text).map_err(|source| ManifestError::Parse {
                path: path.to_owned(),
                source,
            })?;
        manifest.validate()?;
        Ok(Some(manifest))
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.version != 1 {
            return Err(ManifestError::Version(self.version));
        }
        for (name, spec) in &self.languages {
            if spec.argv.is_empty() {
                return Err(ManifestError::EmptyArgv(name.clone()));
            }
            if !spec
                .argv
                .iter()
                .any(|a| a.contains(CONNECTION_FILE_PLACEHOLDER))
            {
                return Err(ManifestError::NoConnectionFile(name.clone()));
            }
        }
        if let Some(unknown) = self
            .default_contexts
            .iter()
            .find(|l| self.resolve(l).is_none())
        {
            return Err(ManifestError::UnknownDefault(unknown.clone()));
        }
        Ok(())
    }

    /// Normalizes a requested language the way E2B does (trimmed, lower case, `None`/empty means
    /// python) and maps aliases to the canonical name. Unknown languages are returned normalized
    /// so the caller can name them in its error.
    pub fn normalize(&self, requested: Option<&str>) -> String {
        let language = requested.map(str::trim).unwrap_or_default().to_lowercase();
        if language.is_empty() {
            return "python".to_owned();
        }
        self.resolve(&language).unwrap_or(language)
    }

    /// The canonical name of `language` (a name or an alias), if the manifest has it.
    fn resolve(&self, language: &str) -> Option<String> {
        if self.languages.contains_key(language) {
            return Some(language.to_owned());
        }
        if let Some((name, _)) = self.languages.iter().find(|(_, spec)| {
            spec.aliases
                .iter()
                .any(|a| a.eq_ignore_ascii_case(language))
        }) {
            return Some(name.clone());
        }
        // E2B's own aliases, in case the manifest does not list them.
        let builtin = match language {
            "js" => "javascript",
            "ts" => "typescript",
            _ => return None,
        };
        self.languages
            .contains_key(builtin)
            .then(|| builtin.to_owned())
    }

    /// The kernel of a canonical language name.
    pub fn language(&self, name: &str) -> Option<&LanguageSpec> {
        self.languages.get(name)
    }

    /// Canonical language names, for error messages.
    pub fn language_names(&self) -> String {
        self.languages
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl LanguageSpec {
    /// The dialect of this kernel, given its canonical language name.
    pub fn dialect(&self, language: &str) -> Dialect {
        self.dialect
            .unwrap_or_else(|| Dialect::for_language(language))
    }

    /// The command line with the connection file filled in.
    pub fn command(&self, connection_file: &Path) -> Vec<String> {
        let path = connection_file.to_string_lossy();
        self.argv
            .iter()
            .map(|a| a.replace(CONNECTION_FILE_PLACEHOLDER, &path))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        serde_json::from_str(
            r#"{"version": 1, "default_contexts": ["python", "javascript"],
                "languages": {
                  "python": {"argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                             "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}},
                  "javascript": {"argv": ["node", "kernel.js", "{connection_file}"], "aliases": ["js", "node"],
                                 "interrupt_mode": "message"},
                  "sql": {"argv": ["python3", "-f", "{connection_file}"], "aliases": ["duckdb"]}
                }}"#,
        )
        .unwrap()
    }

    #[test]
    fn normalizes_like_e2b_and_resolves_aliases() {
        let m = sample();
        m.validate().unwrap();
        assert_eq!(m.normalize(None), "python");
        assert_eq!(m.normalize(Some("")), "python");
        assert_eq!(m.normalize(Some("  Python ")), "python");
        assert_eq!(m.normalize(Some("JS")), "javascript");
        assert_eq!(m.normalize(Some("node")), "javascript");
        assert_eq!(m.normalize(Some("duckdb")), "sql");
        // Unknown stays normalized so the error can name it; `ts` has no kernel here.
        assert_eq!(m.normalize(Some("R")), "r");
        assert_eq!(m.normalize(Some("ts")), "ts");
        assert_eq!(
            m.language("javascript").unwrap().interrupt_mode,
            InterruptMode::Message
        );
        assert_eq!(
            m.language("python").unwrap().interrupt_mode,
            InterruptMode::Signal
        );
        assert_eq!(m.language("sql").unwrap().dialect("sql"), Dialect::Sql);
    }

    #[test]
    fn command_fills_in_the_connection_file() {
        let m = sample();
        assert_eq!(
            m.language("python")
                .unwrap()
                .command(Path::new("/run/k.json")),
            [
                "/usr/bin/python3",
                "-m",
                "ipykernel_launcher",
                "-f",
                "/run/k.json"
            ]
        );
    }

    #[test]
    fn rejects_bad_manifests() {
        let mut m = sample();
        m.version = 2;
        assert!(matches!(m.validate(), Err(ManifestError::Version(2))));
        let mut m = sample();
        m.languages.get_mut("sql").unwrap().argv = vec!["python3".into()];
        assert!(matches!(
            m.validate(),
            Err(ManifestError::NoConnectionFile(l)) if l == "sql"
        ));
        let mut m = sample();
        m.default_contexts.push("r".into());
        assert!(matches!(m.validate(), Err(ManifestError::UnknownDefault(l)) if l == "r"));
    }

    #[test]
    fn missing_file_means_no_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            Manifest::load(&dir.path().join("kernels.json"))
                .unwrap()
                .is_none()
        );
        std::fs::write(dir.path().join("bad.json"), "{").unwrap();
        assert!(matches!(
            Manifest::load(&dir.path().join("bad.json")),
            Err(ManifestError::Parse { .. })
        ));
    }
}
