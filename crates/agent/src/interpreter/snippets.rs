//! Code the agent sends to kernels on the user's behalf: environment variable changes, the SQL
//! wrapper and warm-up statements. Every user-supplied string is embedded as a properly escaped
//! literal, never spliced in raw (E2B interpolates values into quotes unescaped).

use super::manifest::Dialect;

/// A string literal valid in Python, JavaScript, R and Java with exactly `s` as its value.
///
/// JSON's string grammar is a subset of all four: escapes are `\" \\ \b \f \n \r \t \uXXXX`,
/// every other character is literal UTF-8 (serde_json never emits surrogate escapes for a Rust
/// string). Java translates `\uXXXX` before lexing, which is harmless here: JSON uses it only for
/// control characters other than `\n` and `\r` (legal inside a Java literal), and a `\\u` in
/// the value comes out as an escaped backslash, which Java does not translate.
pub fn string_literal(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// A single-quoted shell word with exactly `s` as its value.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The cell that runs `code` in a context of this dialect.
pub fn wrap_user_code(dialect: Dialect, code: &str) -> String {
    match dialect {
        // One line ending in `)`: no IPython input transformer (`!`, `%`, trailing `?`) applies.
        Dialect::Sql => format!("_bulkhead_sql_run({})", string_literal(code)),
        _ => code.to_owned(),
    }
}

/// The silent cell that gives a Python kernel restored as one of several clones of a checkpoint
/// its own randomness and identity: every generator seeded before the checkpoint would
/// otherwise produce the same sequence in every clone. It runs in a throwaway namespace, so the
/// user's namespace is untouched. What it cannot change (the `hash()` seed, the memory layout,
/// the connection's HMAC key) is listed in `docs/threat-model.md`.
pub const PYTHON_RESEED: &str = r#"exec("""
import os, random, sys, uuid
random.seed(os.urandom(32))
_np = sys.modules.get("numpy")
if _np is not None:
    _np.random.seed()
_tf = sys.modules.get("tempfile")
if _tf is not None:
    _tf._name_sequence = None
_k = getattr(get_ipython(), "kernel", None)
if _k is not None:
    _k.session.session = str(uuid.uuid4())
""", {"get_ipython": get_ipython})"#;

/// A statement that changes environment variables: `Some(value)` sets, `None` removes. Returns
/// `None` when there is nothing to do or the dialect cannot do it.
pub fn env_changes(dialect: Dialect, changes: &[(String, Option<String>)]) -> Option<String> {
    if changes.is_empty() {
        return None;
    }
    let lines: Vec<String> = changes
        .iter()
        .map(|(key, value)| {
            let k = string_literal(key);
            match (dialect, value) {
                (Dialect::Python | Dialect::Sql, Some(v)) => {
                    format!("__import__('os').environ[{k}] = {}", string_literal(v))
                }
                (Dialect::Python | Dialect::Sql, None) => {
                    format!("__import__('os').environ.pop({k}, None)")
                }
                (Dialect::Javascript, Some(v)) => {
                    format!("process.env[{k}] = {};", string_literal(v))
                }
                (Dialect::Javascript, None) => format!("delete process.env[{k}];"),
                // Type-checks without Node's type declarations.
                (Dialect::Typescript, Some(v)) => {
                    format!(
                        "(globalThis as any).process.env[{k}] = {};",
                        string_literal(v)
                    )
                }
                (Dialect::Typescript, None) => {
                    format!("delete (globalThis as any).process.env[{k}];")
                }
                (Dialect::Bash, Some(v)) => {
                    format!("export {}", shell_quote(&format!("{key}={v}")))
                }
                (Dialect::Bash, None) => format!("unset {}", shell_quote(key)),
                (Dialect::R, Some(v)) => format!("Sys.setenv({k} = {})", string_literal(v)),
                (Dialect::R, None) => format!("Sys.unsetenv({k})"),
                (Dialect::Java, Some(v)) => {
                    format!("{JAVA_ENV_MAP}.put({k}, {});", string_literal(v))
                }
                (Dialect::Java, None) => format!("{JAVA_ENV_MAP}.remove({k});"),
                (Dialect::Other, _) => String::new(),
            }
        })
        .filter(|l| !l.is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The map behind `System.getenv()` (and the environment of processes the kernel starts),
/// which Java offers read-only: the unmodifiable wrapper's backing map, reached by reflection
/// (the template's JVM opens `java.util` for it). A block expression so it can be used inline.
const JAVA_ENV_MAP: &str = "((java.util.Map<String, String>) ((java.util.function.Supplier<Object>) () -> { \
     try { var f = System.getenv().getClass().getDeclaredField(\"m\"); f.setAccessible(true); \
     return f.get(System.getenv()); } catch (ReflectiveOperationException e) { \
     throw new IllegalStateException(e); } }).get())";

/// The default warm-up statement of a dialect (a no-op that goes through the kernel's whole
/// execute path once).
pub fn default_warmup(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Python | Dialect::Sql => "None",
        Dialect::Javascript | Dialect::Typescript => "undefined",
        Dialect::Bash => "true",
        Dialect::R => "invisible(NULL)",
        // Compiles and runs one snippet, which loads most of JShell's compiler.
        Dialect::Java => "Math.abs(0);",
        Dialect::Other => "",
    }
}

/// Why an environment variable of a request cannot be applied.
pub fn invalid_env_var(key: &str, value: &str) -> Option<String> {
    if key.is_empty() {
        Some("Environment variable names must not be empty".to_owned())
    } else if key.contains('=') || key.contains('\0') {
        Some(format!(
            "Invalid environment variable name {key:?}: names cannot contain '=' or NUL"
        ))
    } else if value.contains('\0') {
        Some(format!(
            "Invalid value for environment variable {key:?}: values cannot contain NUL"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_escape_everything() {
        assert_eq!(string_literal("a"), r#""a""#);
        assert_eq!(
            string_literal("x\"y\\z\n\t\u{1}é'"),
            "\"x\\\"y\\\\z\\n\\t\\u0001é'\""
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn sql_is_wrapped_as_one_python_call() {
        let code = "SELECT 'a\"b' AS x; -- done?\n%not a magic\n!ls";
        let cell = wrap_user_code(Dialect::Sql, code);
        assert_eq!(
            cell,
            r#"_bulkhead_sql_run("SELECT 'a\"b' AS x; -- done?\n%not a magic\n!ls")"#
        );
        assert!(!cell.contains('\n'));
        assert_eq!(wrap_user_code(Dialect::Python, "1+1"), "1+1");
    }

    #[test]
    fn env_snippets_per_dialect() {
        let changes = vec![
            ("A".to_owned(), Some("x'y\"z".to_owned())),
            ("B".to_owned(), None),
        ];
        assert_eq!(
            env_changes(Dialect::Python, &changes).unwrap(),
            "__import__('os').environ[\"A\"] = \"x'y\\\"z\"\n__import__('os').environ.pop(\"B\", None)"
        );
        assert_eq!(
            env_changes(Dialect::Javascript, &changes).unwrap(),
            "process.env[\"A\"] = \"x'y\\\"z\";\ndelete process.env[\"B\"];"
        );
        assert!(
            env_changes(Dialect::Typescript, &changes)
                .unwrap()
                .starts_with("(globalThis as any).process.env[\"A\"]")
        );
        assert_eq!(
            env_changes(Dialect::Bash, &changes).unwrap(),
            "export 'A=x'\\''y\"z'\nunset 'B'"
        );
        assert_eq!(
            env_changes(Dialect::R, &changes).unwrap(),
            "Sys.setenv(\"A\" = \"x'y\\\"z\")\nSys.unsetenv(\"B\")"
        );
        let java = env_changes(Dialect::Java, &changes).unwrap();
        assert!(java.contains(".put(\"A\", \"x'y\\\"z\");"), "{java}");
        assert!(java.contains(".remove(\"B\");"), "{java}");
        assert_eq!(env_changes(Dialect::Other, &changes), None);
        assert_eq!(env_changes(Dialect::Python, &[]), None);
    }

    #[test]
    fn env_validation() {
        assert!(invalid_env_var("A", "b").is_none());
        assert!(invalid_env_var("", "b").is_some());
        assert!(invalid_env_var("A=B", "b").is_some());
        assert!(invalid_env_var("A", "b\0").is_some());
    }
}
