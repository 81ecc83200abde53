//! The API reference page (`GET /docs/api`): plain HTML rendered from the OpenAPI document on
//! the server, so it works offline and ships nothing but this code (no JS renderer, no CDN).
//! It walks the document as JSON: every operation by tag (method, path, auth, parameters,
//! body, responses), then every schema with its properties.

use std::fmt::Write;

use serde_json::Value;

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "patch", "head", "options", "trace",
];

const STYLE: &str = "body{font:15px/1.5 system-ui,sans-serif;max-width:62rem;margin:2rem auto;\
padding:0 1rem;color:#1b1f24}code,pre{font:13px ui-monospace,monospace}h2{border-bottom:1px solid \
#ccd;margin-top:2.5rem}.op{border:1px solid #dde;border-radius:6px;margin:1rem 0;padding:.5rem 1rem}\
.m{display:inline-block;min-width:4.5rem;font-weight:700;text-transform:uppercase}.get{color:#0a6}\
.post{color:#06c}.put,.patch{color:#a60}.delete{color:#c22}table{border-collapse:collapse;\
margin:.3rem 0}td,th{border:1px solid #dde;padding:.15rem .5rem;text-align:left;vertical-align:top}\
nav a{margin-right:.8rem}.d{white-space:pre-wrap}";

/// The whole page.
pub(crate) fn render(doc: &utoipa::openapi::OpenApi) -> String {
    let doc = serde_json::to_value(doc).unwrap_or_default();
    let info = &doc["info"];
    let mut out = String::new();
    let title = esc(info["title"].as_str().unwrap_or("API"));
    let _ = write!(
        out,
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>\
         <meta name=viewport content='width=device-width,initial-scale=1'><style>{STYLE}</style>\
         </head><body><h1>{title} <small>{}</small></h1><p class=d>{}</p>\
         <p>Machine-readable: <a href=\"/openapi.json\">/openapi.json</a></p><nav>",
        esc(info["version"].as_str().unwrap_or("")),
        esc(info["description"].as_str().unwrap_or("")),
    );
    let tags: Vec<&Value> = doc["tags"].as_array().into_iter().flatten().collect();
    for t in &tags {
        let name = t["name"].as_str().unwrap_or("");
        let _ = write!(out, "<a href=\"#tag-{}\">{}</a>", anchor(name), esc(name));
    }
    out.push_str("<a href=\"#schemas\">schemas</a></nav>");
    for t in &tags {
        let name = t["name"].as_str().unwrap_or("");
        let _ = write!(
            out,
            "<h2 id=\"tag-{}\">{}</h2><p>{}</p>",
            anchor(name),
            esc(name),
            esc(t["description"].as_str().unwrap_or(""))
        );
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for m in METHODS {
                let op = &item[m];
                let in_tag = op["tags"]
                    .as_array()
                    .is_some_and(|ts| ts.iter().any(|x| x == name));
                if in_tag {
                    operation(&mut out, m, path, op);
                }
            }
        }
    }
    out.push_str("<h2 id=schemas>Schemas</h2>");
    for (name, schema) in doc["components"]["schemas"]
        .as_object()
        .into_iter()
        .flatten()
    {
        schema_section(&mut out, name, schema);
    }
    out.push_str("</body></html>\n");
    out
}

fn operation(out: &mut String, method: &str, path: &str, op: &Value) {
    let _ = write!(
        out,
        "<div class=op><div><span class=\"m {method}\">{method}</span> <code>{}</code></div>",
        esc(path)
    );
    for key in ["summary", "description"] {
        if let Some(d) = op[key].as_str() {
            let _ = write!(out, "<p class=d>{}</p>", esc(d));
        }
    }
    let auth: Vec<String> = op["security"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_object())
        .flat_map(|r| r.keys().cloned())
        .collect();
    let auth = if auth.is_empty() {
        "none".to_string()
    } else {
        auth.join(" or ")
    };
    let _ = write!(out, "<p>Auth: {}</p>", esc(&auth));
    if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
        out.push_str(
            "<table><tr><th>Parameter</th><th>In</th><th>Type</th><th>Description</th></tr>",
        );
        for p in params {
            let req = if p["required"] == true {
                " (required)"
            } else {
                ""
            };
            let _ = write!(
                out,
                "<tr><td><code>{}</code>{req}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(p["name"].as_str().unwrap_or("")),
                esc(p["in"].as_str().unwrap_or("")),
                type_of(&p["schema"]),
                esc(p["description"].as_str().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    if let Some(content) = op["requestBody"]["content"].as_object() {
        for (mime, c) in content {
            let _ = write!(
                out,
                "<p>Body (<code>{}</code>): {}</p>",
                esc(mime),
                type_of(&c["schema"])
            );
        }
    }
    out.push_str("<table><tr><th>Status</th><th>Description</th><th>Body</th></tr>");
    for (status, r) in op["responses"].as_object().into_iter().flatten() {
        let body: Vec<String> = r["content"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(mime, c)| format!("<code>{}</code> {}", esc(mime), type_of(&c["schema"])))
            .collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(status),
            esc(r["description"].as_str().unwrap_or("")),
            body.join("<br>")
        );
    }
    out.push_str("</table></div>");
}

fn schema_section(out: &mut String, name: &str, schema: &Value) {
    let _ = write!(
        out,
        "<div class=op id=\"schema-{}\"><b>{}</b>",
        anchor(name),
        esc(name)
    );
    if let Some(d) = schema["description"].as_str() {
        let _ = write!(out, "<p class=d>{}</p>", esc(d));
    }
    match schema["properties"].as_object() {
        Some(props) => {
            let required: Vec<&str> = schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            out.push_str("<table><tr><th>Field</th><th>Type</th><th>Description</th></tr>");
            for (field, p) in props {
                let req = if required.contains(&field.as_str()) {
                    " (required)"
                } else {
                    ""
                };
                let _ = write!(
                    out,
                    "<tr><td><code>{}</code>{req}</td><td>{}</td><td class=d>{}</td></tr>",
                    esc(field),
                    type_of(p),
                    esc(p["description"].as_str().unwrap_or(""))
                );
            }
            out.push_str("</table>");
        }
        None => {
            let _ = write!(out, "<p>{}</p>", type_of(schema));
        }
    }
    out.push_str("</div>");
}

/// A short, linked description of a schema: `Sandbox`, `array of Secret`, `string (date-time)`.
fn type_of(s: &Value) -> String {
    if let Some(r) = s["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("<a href=\"#schema-{}\">{}</a>", anchor(name), esc(name));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(v) = s[key].as_array() {
            let parts: Vec<String> = v
                .iter()
                .filter(|x| x["type"] != "null")
                .map(type_of)
                .collect();
            return parts.join(" or ");
        }
    }
    if let Some(e) = s["enum"].as_array() {
        let vals: Vec<String> = e.iter().map(|v| esc(&v.to_string())).collect();
        return format!("one of {}", vals.join(", "));
    }
    let ty = match &s["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_string(),
    };
    match ty.as_str() {
        "array" => format!("array of {}", type_of(&s["items"])),
        "object" if s["additionalProperties"].is_object() => {
            format!("map of {}", type_of(&s["additionalProperties"]))
        }
        _ => match s["format"].as_str() {
            Some(f) => format!("{} ({})", esc(&ty), esc(f)),
            None => esc(&ty),
        },
    }
}

fn anchor(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_links() {
        assert_eq!(esc("<a href='x'>&"), "&lt;a href=&#39;x&#39;&gt;&amp;");
        let arr =
            serde_json::json!({"type": "array", "items": {"$ref": "#/components/schemas/Sandbox"}});
        assert_eq!(
            type_of(&arr),
            "array of <a href=\"#schema-Sandbox\">Sandbox</a>"
        );
        let opt = serde_json::json!({"type": ["string", "null"], "format": "date-time"});
        assert_eq!(type_of(&opt), "string (date-time)");
    }
}
