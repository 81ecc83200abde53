//! The NDJSON lines of `POST /execute`, shaped exactly like E2B's code-interpreter server
//! (`template/server/api/models/*.py`), and their mapping from Jupyter messages.

use serde_json::{Map, Value, json};

/// One line of the response.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// `stream` on stdout.
    Stdout {
        /// Text.
        text: String,
        /// ISO-8601 time of the kernel message.
        timestamp: String,
    },
    /// `stream` on stderr.
    Stderr {
        /// Text.
        text: String,
        /// ISO-8601 time of the kernel message.
        timestamp: String,
    },
    /// `execute_result` (main) or `display_data`, already mapped to E2B's field names.
    Result(Map<String, Value>),
    /// The first error of the execution.
    Error(ErrorLine),
    /// `execute_input`'s execution count.
    NumberOfExecutions(i64),
    /// Written every 5 s of silence so a vanished client is noticed.
    Keepalive,
    /// Always the last line.
    EndOfExecution,
}

/// An `error` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorLine {
    /// Exception name (`ename`).
    pub name: String,
    /// Exception value (`evalue`).
    pub value: String,
    /// Traceback lines joined without separator (as E2B does).
    pub traceback: String,
}

impl ErrorLine {
    /// An error the agent itself reports (E2B's synthetic errors have an empty traceback).
    pub fn synthetic(name: &str, value: impl Into<String>) -> Self {
        Self {
            name: name.to_owned(),
            value: value.into(),
            traceback: String::new(),
        }
    }

    /// From the content of an `error` message or an `execute_reply` with status `error`.
    pub fn from_content(content: &Value) -> Self {
        let text = |key: &str| {
            content
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let traceback = match content.get("traceback") {
            Some(Value::Array(lines)) => lines
                .iter()
                .map(|l| match l {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<String>(),
            Some(Value::String(s)) => s.clone(),
            _ => String::new(),
        };
        Self {
            name: text("ename"),
            value: text("evalue"),
            traceback,
        }
    }
}

impl Line {
    /// The line as JSON followed by `\n`.
    pub fn to_ndjson(&self) -> String {
        let value = match self {
            Line::Stdout { text, timestamp } => {
                json!({"type": "stdout", "text": text, "timestamp": timestamp})
            }
            Line::Stderr { text, timestamp } => {
                json!({"type": "stderr", "text": text, "timestamp": timestamp})
            }
            Line::Result(fields) => {
                let mut object = Map::with_capacity(fields.len() + 1);
                object.insert("type".to_owned(), json!("result"));
                object.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
                Value::Object(object)
            }
            Line::Error(e) => json!({
                "type": "error", "name": e.name, "value": e.value, "traceback": e.traceback,
            }),
            Line::NumberOfExecutions(n) => {
                json!({"type": "number_of_executions", "execution_count": n})
            }
            Line::Keepalive => json!({"type": "keepalive"}),
            Line::EndOfExecution => json!({"type": "end_of_execution"}),
        };
        let mut text = value.to_string();
        text.push('\n');
        text
    }
}

/// MIME types with a field of their own, in E2B's order; everything else goes to `extra`.
const FIELDS: [(&str, &str); 12] = [
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("e2b/data", "data"),
    ("e2b/chart", "chart"),
];

/// Text-valued fields: notebook-style line lists are joined.
const TEXT_FIELDS: [&str; 9] = [
    "text",
    "html",
    "markdown",
    "svg",
    "png",
    "jpeg",
    "pdf",
    "latex",
    "javascript",
];

/// Maps a Jupyter MIME bundle to a `result` line's fields (E2B's `Result.__init__`).
///
/// `null` fields are omitted; `extra` (the unknown MIME types) is always present, possibly
/// empty, because E2B serializes it with `exclude_none` and it is never `None` there.
pub fn result_fields(bundle: &Map<String, Value>, is_main_result: bool) -> Map<String, Value> {
    let mut extra = bundle.clone();
    let mut fields = Map::new();
    for (mime, field) in FIELDS {
        let Some(value) = extra.remove(mime) else {
            continue;
        };
        let value = if TEXT_FIELDS.contains(&field) {
            join_text(value)
        } else {
            value
        };
        if value.is_null() {
            continue;
        }
        let value = match (field, value) {
            ("text", Value::String(text)) => Value::String(strip_quotes(&text).to_owned()),
            (_, v) => v,
        };
        fields.insert(field.to_owned(), value);
    }
    fields.insert("extra".to_owned(), Value::Object(extra));
    fields.insert("is_main_result".to_owned(), Value::Bool(is_main_result));
    fields
}

/// Kernels may send text as a list of lines (the notebook format).
fn join_text(value: Value) -> Value {
    match value {
        Value::Array(parts) if parts.iter().all(Value::is_string) => {
            Value::String(parts.iter().filter_map(Value::as_str).collect::<String>())
        }
        other => other,
    }
}

/// E2B strips one pair of surrounding quotes from `text/plain` (so `'abc'` reads `abc`), with
/// Python's slicing semantics (a lone quote becomes empty).
pub fn strip_quotes(text: &str) -> &str {
    let quoted = |q: char| text.starts_with(q) && text.ends_with(q);
    if quoted('\'') || quoted('"') {
        // Both ends are one-byte ASCII quotes; a single quote character yields "".
        text.get(1..text.len().saturating_sub(1)).unwrap_or("")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &Line) -> Value {
        let text = line.to_ndjson();
        assert!(text.ends_with('\n') && !text[..text.len() - 1].contains('\n'));
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn mime_bundle_maps_to_e2b_fields() {
        let bundle = json!({
            "text/plain": "'hello'",
            "text/html": ["<b>", "x</b>"],
            "text/markdown": "*m*",
            "image/svg+xml": "<svg/>",
            "image/png": "iVBOR",
            "image/jpeg": "/9j/",
            "application/pdf": "JVBER",
            "text/latex": "$x$",
            "application/json": {"a": [1, 2]},
            "application/javascript": "alert(1)",
            "e2b/data": {"col": [1, 2]},
            "e2b/chart": {"type": "line", "elements": []},
            "application/vnd.plotly.v1+json": {"data": []},
            "image/gif": "R0lG",
        });
        let fields = result_fields(bundle.as_object().unwrap(), true);
        let line = parse(&Line::Result(fields));
        assert_eq!(
            line,
            json!({
                "type": "result",
                "text": "hello",
                "html": "<b>x</b>",
                "markdown": "*m*",
                "svg": "<svg/>",
                "png": "iVBOR",
                "jpeg": "/9j/",
                "pdf": "JVBER",
                "latex": "$x$",
                "json": {"a": [1, 2]},
                "javascript": "alert(1)",
                "data": {"col": [1, 2]},
                "chart": {"type": "line", "elements": []},
                "extra": {"application/vnd.plotly.v1+json": {"data": []}, "image/gif": "R0lG"},
                "is_main_result": true,
            })
        );
    }

    #[test]
    fn display_data_is_not_main_and_missing_fields_are_omitted() {
        let bundle = json!({"image/png": "abc", "text/plain": "<Figure size 640x480 with 1 Axes>"});
        let line = parse(&Line::Result(result_fields(
            bundle.as_object().unwrap(),
            false,
        )));
        assert_eq!(
            line,
            json!({"type": "result", "png": "abc", "text": "<Figure size 640x480 with 1 Axes>",
                   "extra": {}, "is_main_result": false})
        );
    }

    #[test]
    fn quote_stripping_follows_python_slicing() {
        assert_eq!(strip_quotes("'abc'"), "abc");
        assert_eq!(strip_quotes("\"abc\""), "abc");
        assert_eq!(strip_quotes("''"), "");
        assert_eq!(strip_quotes("'"), "");
        assert_eq!(strip_quotes("\""), "");
        assert_eq!(strip_quotes("'abc\""), "'abc\"");
        assert_eq!(strip_quotes("2"), "2");
        assert_eq!(strip_quotes("'a' + 'b'"), "a' + 'b");
        assert_eq!(strip_quotes("'héllo'"), "héllo");
        assert_eq!(strip_quotes(""), "");
    }

    #[test]
    fn errors_join_the_traceback_without_separator() {
        let content = json!({
            "ename": "ZeroDivisionError", "evalue": "division by zero",
            "traceback": ["\u{1b}[0;31m---\u{1b}[0m", "Cell In[1], line 1\n----> 1 1/0\n", "ZeroDivisionError: division by zero"],
        });
        let error = ErrorLine::from_content(&content);
        assert_eq!(error.name, "ZeroDivisionError");
        assert_eq!(error.value, "division by zero");
        assert_eq!(
            error.traceback,
            "\u{1b}[0;31m---\u{1b}[0mCell In[1], line 1\n----> 1 1/0\nZeroDivisionError: division by zero"
        );
        assert_eq!(
            parse(&Line::Error(error)),
            json!({"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
                   "traceback": "\u{1b}[0;31m---\u{1b}[0mCell In[1], line 1\n----> 1 1/0\nZeroDivisionError: division by zero"})
        );
        // A reply without details still yields a well-formed line.
        assert_eq!(
            ErrorLine::from_content(&json!({"status": "error"})),
            ErrorLine::synthetic("", "")
        );
    }

    #[test]
    fn other_lines() {
        assert_eq!(
            parse(&Line::Stdout {
                text: "a\n".into(),
                timestamp: "2025-01-01T00:00:00.000001Z".into()
            }),
            json!({"type": "stdout", "text": "a\n", "timestamp": "2025-01-01T00:00:00.000001Z"})
        );
        assert_eq!(
            parse(&Line::Stderr {
                text: "e".into(),
                timestamp: "t".into()
            })["type"],
            "stderr"
        );
        assert_eq!(
            parse(&Line::NumberOfExecutions(3)),
            json!({"type": "number_of_executions", "execution_count": 3})
        );
        assert_eq!(parse(&Line::Keepalive), json!({"type": "keepalive"}));
        assert_eq!(
            parse(&Line::EndOfExecution),
            json!({"type": "end_of_execution"})
        );
    }
}
