//! Secret references in header values, E2B syntax: `${e2b.secrets.NAME}` (what the E2B SDK's
//! `Secret.fill(NAME)` produces). The proxy replaces them at request time; the sandbox only
//! ever sees the placeholder text.

use async_trait::async_trait;

const OPEN: &str = "${";
const SECRET_NS: &str = "e2b.secrets.";
const E2B_NS: &str = "e2b.";

/// Where the proxy looks up secret values: `reference` is the secret NAME from
/// `${e2b.secrets.NAME}`, `scope` the owner whose secrets the sandbox's rules may use (its
/// team, [`NetworkPolicy::secret_scope`](crate::NetworkPolicy::secret_scope)). Returns `None`
/// when that owner has no such secret; another owner's secret of the same name must never be
/// returned.
#[async_trait]
pub trait SecretSource: Send + Sync {
    async fn resolve(&self, scope: &str, reference: &str) -> Option<String>;
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SecretRefError {
    #[error("unterminated placeholder starting at byte {0}: write ${{e2b.secrets.NAME}}")]
    Unterminated(usize),
    #[error("empty secret name in placeholder: write ${{e2b.secrets.NAME}}")]
    EmptyName,
    #[error(
        "placeholder ${{{0}}} is not supported: only ${{e2b.secrets.NAME}} references can be resolved"
    )]
    UnsupportedNamespace(String),
    #[error("header values cannot contain control characters (CR, LF, NUL)")]
    ControlChars,
}

#[derive(Debug, PartialEq)]
pub(crate) enum Piece<'a> {
    Literal(&'a str),
    Secret(&'a str),
}

/// Splits a header template into literal text and secret references. `${...}` placeholders
/// outside the `e2b.` namespace are kept literally (they are not ours to interpret).
pub(crate) fn parse_template(value: &str) -> Result<Vec<Piece<'_>>, SecretRefError> {
    let mut out = Vec::new();
    let mut rest = value;
    let mut offset = 0;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        if !after.starts_with(E2B_NS) {
            out.push(Piece::Literal(&rest[..start + OPEN.len()]));
            offset += start + OPEN.len();
            rest = after;
            continue;
        }
        let Some(end) = after.find('}') else {
            return Err(SecretRefError::Unterminated(offset + start));
        };
        let inner = &after[..end];
        let Some(name) = inner.strip_prefix(SECRET_NS) else {
            return Err(SecretRefError::UnsupportedNamespace(inner.to_string()));
        };
        if name.is_empty() {
            return Err(SecretRefError::EmptyName);
        }
        if start > 0 {
            out.push(Piece::Literal(&rest[..start]));
        }
        out.push(Piece::Secret(name));
        let consumed = start + OPEN.len() + end + 1;
        offset += consumed;
        rest = &rest[consumed..];
    }
    if !rest.is_empty() {
        out.push(Piece::Literal(rest));
    }
    Ok(out)
}

fn has_ctl(s: &str) -> bool {
    s.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
}

/// Validation used by `NetworkPolicy::validate`.
pub(crate) fn check_template(value: &str) -> Result<(), SecretRefError> {
    if has_ctl(value) {
        return Err(SecretRefError::ControlChars);
    }
    parse_template(value).map(|_| ())
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum RenderError {
    #[error(transparent)]
    Template(#[from] SecretRefError),
    #[error(
        "secret {0:?} is referenced by a header rule but does not exist; create it with POST /secrets"
    )]
    Unknown(String),
    #[error("secret {0:?} has a value that is not a valid HTTP header value (control characters)")]
    BadValue(String),
}

/// Resolves every reference in `value` among `scope`'s secrets. Never returns a partially
/// rendered value: an unknown secret (or any secret without a scope) is an error, so the
/// literal placeholder is never forwarded upstream.
pub(crate) async fn render(
    value: &str,
    scope: Option<&str>,
    source: &dyn SecretSource,
) -> Result<String, RenderError> {
    let mut out = String::with_capacity(value.len());
    for piece in parse_template(value)? {
        match piece {
            Piece::Literal(s) => out.push_str(s),
            Piece::Secret(name) => {
                let found = match scope {
                    Some(scope) => source.resolve(scope, name).await,
                    None => None,
                };
                let v = found.ok_or_else(|| RenderError::Unknown(name.to_string()))?;
                if has_ctl(&v) {
                    return Err(RenderError::BadValue(name.to_string()));
                }
                out.push_str(&v);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// (scope, name) → value.
    struct Map(HashMap<(String, String), String>);
    #[async_trait]
    impl SecretSource for Map {
        async fn resolve(&self, scope: &str, reference: &str) -> Option<String> {
            self.0
                .get(&(scope.to_string(), reference.to_string()))
                .cloned()
        }
    }

    fn entry(scope: &str, name: &str, value: &str) -> ((String, String), String) {
        ((scope.to_string(), name.to_string()), value.to_string())
    }

    #[test]
    fn parse() {
        assert_eq!(
            parse_template("Bearer ${e2b.secrets.tok} x").unwrap(),
            vec![
                Piece::Literal("Bearer "),
                Piece::Secret("tok"),
                Piece::Literal(" x")
            ]
        );
        assert_eq!(
            parse_template("${FOO}").unwrap(),
            vec![Piece::Literal("${"), Piece::Literal("FOO}")]
        );
        assert_eq!(
            parse_template("${e2b.secrets.a}${e2b.secrets.b}").unwrap(),
            vec![Piece::Secret("a"), Piece::Secret("b")]
        );
        assert_eq!(
            parse_template("${e2b.secrets.a"),
            Err(SecretRefError::Unterminated(0))
        );
        assert_eq!(
            parse_template("${e2b.secrets.}"),
            Err(SecretRefError::EmptyName)
        );
        assert!(matches!(
            parse_template("${e2b.identity.tokens.aws}"),
            Err(SecretRefError::UnsupportedNamespace(_))
        ));
        assert_eq!(check_template("a\r\nb"), Err(SecretRefError::ControlChars));
    }

    #[tokio::test]
    async fn render_values() {
        let m = Map(HashMap::from([
            entry("a", "tok", "s3cr3t"),
            entry("a", "bad", "a\nb"),
        ]));
        let a = Some("a");
        assert_eq!(
            render("Bearer ${e2b.secrets.tok}", a, &m).await.unwrap(),
            "Bearer s3cr3t"
        );
        assert_eq!(render("plain", a, &m).await.unwrap(), "plain");
        assert_eq!(
            render("${e2b.secrets.nope}", a, &m).await,
            Err(RenderError::Unknown("nope".into()))
        );
        assert_eq!(
            render("${e2b.secrets.bad}", a, &m).await,
            Err(RenderError::BadValue("bad".into()))
        );
    }

    #[tokio::test]
    async fn render_only_in_scope() {
        let m = Map(HashMap::from([
            entry("team-a", "tok", "A-VALUE"),
            entry("team-b", "tok", "B-VALUE"),
            entry("team-a", "only-a", "A-ONLY"),
        ]));
        let r = |scope| render("${e2b.secrets.tok}", scope, &m);
        assert_eq!(r(Some("team-a")).await.unwrap(), "A-VALUE");
        assert_eq!(r(Some("team-b")).await.unwrap(), "B-VALUE");
        // Another scope's name is as unknown as a name nobody has.
        assert_eq!(
            render("${e2b.secrets.only-a}", Some("team-b"), &m).await,
            Err(RenderError::Unknown("only-a".into()))
        );
        // No scope: nothing resolves, whatever exists.
        assert_eq!(r(None).await, Err(RenderError::Unknown("tok".into())));
        assert_eq!(render("plain", None, &m).await.unwrap(), "plain");
    }
}
