//! Parsing a multipart part's `Content-Disposition` for the destination file name (RFC 6266
//! `filename=` and RFC 5987 `filename*=`), keeping directory components: the E2B SDKs send the
//! destination path there.

/// The destination in a part's `Content-Disposition` (`filename*=` preferred over `filename=`),
/// with directory components kept.
pub fn disposition_filename(value: &str) -> Option<String> {
    let mut plain = None;
    let mut extended = None;
    for param in split_params(value).into_iter().skip(1) {
        let Some((key, raw)) = param.split_once('=') else {
            continue;
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "filename" => plain = Some(unquote(raw.trim())),
            "filename*" => {
                let raw = unquote(raw.trim());
                // RFC 5987: charset'language'percent-encoded
                let mut pieces = raw.splitn(3, '\'');
                let (charset, _, encoded) = (pieces.next(), pieces.next(), pieces.next());
                if let (Some(charset), Some(encoded)) = (charset, encoded) {
                    let bytes = urlencoding::decode_binary(encoded.as_bytes()).into_owned();
                    extended = if charset.eq_ignore_ascii_case("utf-8") {
                        String::from_utf8(bytes).ok()
                    } else {
                        Some(bytes.iter().map(|b| char::from(*b)).collect())
                    };
                }
            }
            _ => {}
        }
    }
    extended.or(plain).filter(|f| !f.is_empty())
}

/// Splits a header value at `;` outside quoted strings.
fn split_params(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut escaped = false;
    for c in value.chars() {
        if escaped {
            current.push(c);
            escaped = false;
            continue;
        }
        match c {
            '\\' if in_quotes => {
                current.push(c);
                escaped = true;
            }
            '"' => {
                in_quotes = !in_quotes;
                current.push(c);
            }
            ';' if !in_quotes => out.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    out.push(current);
    out
}

fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('"') else {
        return value.to_owned();
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            '"' => break,
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_keep_directories() {
        assert_eq!(
            disposition_filename(r#"form-data; name="file"; filename="/home/user/dir/a.txt""#)
                .as_deref(),
            Some("/home/user/dir/a.txt")
        );
        assert_eq!(
            disposition_filename(r#"form-data; name="file"; filename="a;b \"q\".txt""#).as_deref(),
            Some(r#"a;b "q".txt"#)
        );
        assert_eq!(
            disposition_filename(
                "form-data; name=file; filename*=UTF-8''d%C3%ADr%2Fx.txt; filename=x"
            )
            .as_deref(),
            Some("dír/x.txt")
        );
        assert_eq!(disposition_filename(r#"form-data; name="file""#), None);
        assert_eq!(
            disposition_filename(r#"form-data; name="file"; filename="""#),
            None
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        /// `value` as an RFC 9110 quoted string.
        fn quote(value: &str) -> String {
            let mut out = String::from("\"");
            for c in value.chars() {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
            out
        }

        proptest! {
            #[test]
            fn never_panics(value in any::<String>()) {
                let _ = disposition_filename(&value);
            }

            #[test]
            fn never_panics_on_header_like_input(value in r#"form-data(; ?[a-z*]{1,9}=("[^"]{0,12}"?|[^;]{0,12}))*"#) {
                let _ = disposition_filename(&value);
            }

            #[test]
            fn quoted_filenames_round_trip(name in any::<String>().prop_filter("non-empty", |n| !n.is_empty())) {
                let header = format!("form-data; name=\"file\"; filename={}", quote(&name));
                prop_assert_eq!(disposition_filename(&header), Some(name));
            }

            #[test]
            fn extended_filenames_round_trip_and_win(name in any::<String>().prop_filter("non-empty", |n| !n.is_empty()), plain in "[a-z]{1,8}") {
                let encoded = urlencoding::encode(&name);
                let header = format!("form-data; name=file; filename=\"{plain}\"; filename*=UTF-8''{encoded}");
                prop_assert_eq!(disposition_filename(&header), Some(name.clone()));
                let header = format!("form-data; filename*=utf-8''{encoded}; filename={plain}");
                prop_assert_eq!(disposition_filename(&header), Some(name));
            }

            #[test]
            fn token_filenames_round_trip(name in "[A-Za-z0-9._/~-]{1,40}") {
                let header = format!("form-data; name=file; filename={name}");
                prop_assert_eq!(disposition_filename(&header), Some(name));
            }
        }
    }
}
