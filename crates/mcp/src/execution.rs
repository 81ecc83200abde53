//! An execution as the model sees it: the interpreter's NDJSON stream (E2B's `/execute` lines:
//! `stdout`, `stderr`, `result`, `error`, `number_of_executions`, `keepalive`,
//! `end_of_execution`) folded into one JSON summary (stdout, stderr, results with their text,
//! markdown and chart data, the error) plus one MCP image block per PNG/JPEG result, so a chart
//! reaches a multimodal model as an image rather than as base64 text.

use rmcp::model::ContentBlock;
use serde_json::{Map, Value, json};

/// Result formats given to the model as text in the summary (images go as image blocks; the
/// rest are large or for browsers).
const TEXT_FORMATS: &[&str] = &["text", "markdown", "json", "latex", "chart", "data"];
const IMAGE_FORMATS: &[(&str, &str)] = &[("png", "image/png"), ("jpeg", "image/jpeg")];

#[derive(Debug, Default, PartialEq)]
pub(crate) struct Execution {
    pub stdout: String,
    pub stderr: String,
    pub results: Vec<Map<String, Value>>,
    pub error: Option<Value>,
    pub execution_count: Option<i64>,
    /// Whether the stream reached `end_of_execution` (else the kernel died or the stream broke).
    pub finished: bool,
}

/// Fold the NDJSON body; lines that are not JSON objects are skipped.
pub(crate) fn parse(body: &[u8]) -> Execution {
    let mut ex = Execution::default();
    for line in body.split(|b| *b == b'\n') {
        let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let kind = obj.remove("type");
        match kind.as_ref().and_then(Value::as_str) {
            Some("stdout") => ex.stdout.push_str(text(&obj)),
            Some("stderr") => ex.stderr.push_str(text(&obj)),
            Some("result") => ex.results.push(obj),
            Some("error") => {
                ex.error = Some(json!({
                    "name": obj.get("name").cloned().unwrap_or(Value::Null),
                    "value": obj.get("value").cloned().unwrap_or(Value::Null),
                    "traceback": obj.get("traceback").cloned().unwrap_or(Value::Null),
                }))
            }
            Some("number_of_executions") => {
                ex.execution_count = obj.get("execution_count").and_then(Value::as_i64)
            }
            Some("end_of_execution") => ex.finished = true,
            _ => {}
        }
    }
    ex
}

fn text(obj: &Map<String, Value>) -> &str {
    obj.get("text").and_then(Value::as_str).unwrap_or("")
}

impl Execution {
    /// The summary as the first block, then the images.
    pub fn into_contents(self) -> Vec<ContentBlock> {
        let mut images = Vec::new();
        let results: Vec<Value> = self
            .results
            .iter()
            .map(|r| {
                let mut shown = Map::new();
                for f in TEXT_FORMATS {
                    if let Some(v) = r.get(*f) {
                        shown.insert((*f).to_string(), v.clone());
                    }
                }
                let mut formats: Vec<&str> = Vec::new();
                for (key, mime) in IMAGE_FORMATS {
                    if let Some(data) = r.get(*key).and_then(Value::as_str) {
                        images.push(ContentBlock::image(data, *mime));
                        formats.push(key);
                    }
                }
                for key in ["html", "svg", "javascript"] {
                    if r.contains_key(key) {
                        formats.push(key);
                    }
                }
                if !formats.is_empty() {
                    shown.insert("other_formats".into(), json!(formats));
                }
                if r.get("is_main_result").and_then(Value::as_bool) == Some(true) {
                    shown.insert("is_main_result".into(), Value::Bool(true));
                }
                Value::Object(shown)
            })
            .collect();
        let mut summary = json!({
            "stdout": self.stdout,
            "stderr": self.stderr,
            "results": results,
            "error": self.error,
            "execution_count": self.execution_count,
        });
        if !self.finished {
            summary["warning"] = json!(
                "the execution stream ended early: the kernel may have died (out of memory?); state may be lost"
            );
        }
        let mut out = vec![ContentBlock::text(
            serde_json::to_string_pretty(&summary).unwrap_or_default(),
        )];
        out.extend(images);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        r#"{"type":"stdout","text":"a\n","timestamp":"t"}"#,
        "\n",
        r#"{"type":"stderr","text":"w\n","timestamp":"t"}"#,
        "\n",
        r#"{"type":"result","text":"<Figure>","png":"iVBOR","chart":{"type":"line","elements":[]},"is_main_result":false}"#,
        "\n",
        r#"{"type":"result","text":"42","markdown":"**42**","html":"<b>42</b>","is_main_result":true}"#,
        "\n",
        r#"{"type":"keepalive"}"#,
        "\n",
        r#"{"type":"number_of_executions","execution_count":3}"#,
        "\n",
        r#"{"type":"end_of_execution"}"#,
        "\n"
    );

    #[test]
    fn folds_the_stream() {
        let ex = parse(STREAM.as_bytes());
        assert_eq!(ex.stdout, "a\n");
        assert_eq!(ex.stderr, "w\n");
        assert_eq!(ex.results.len(), 2);
        assert_eq!(ex.execution_count, Some(3));
        assert!(ex.finished);
        assert_eq!(ex.error, None);
    }

    #[test]
    fn images_become_image_blocks_and_the_rest_a_summary() {
        let contents = parse(STREAM.as_bytes()).into_contents();
        assert_eq!(contents.len(), 2);
        let ContentBlock::Text(summary) = &contents[0] else {
            panic!("first block is the summary: {:?}", contents[0]);
        };
        let v: Value = serde_json::from_str(&summary.text).unwrap();
        assert_eq!(v["results"][0]["chart"]["type"], "line");
        assert_eq!(v["results"][0]["other_formats"], json!(["png"]));
        assert_eq!(v["results"][1]["markdown"], "**42**");
        assert_eq!(v["results"][1]["other_formats"], json!(["html"]));
        assert!(v.get("warning").is_none());
        let ContentBlock::Image(img) = &contents[1] else {
            panic!("second block is the chart: {:?}", contents[1]);
        };
        assert_eq!(img.data, "iVBOR");
        assert_eq!(img.mime_type, "image/png");
    }

    #[test]
    fn errors_and_broken_streams_are_reported() {
        let body = concat!(
            r#"{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"tb"}"#,
            "\nnot json\n"
        );
        let ex = parse(body.as_bytes());
        assert_eq!(ex.error.as_ref().unwrap()["name"], "ZeroDivisionError");
        assert!(!ex.finished);
        let ContentBlock::Text(summary) = &ex.into_contents()[0] else {
            panic!("summary first");
        };
        assert!(summary.text.contains("ended early"));
    }
}
