//! Content-coding negotiation of downloads (`Accept-Encoding`): gzip or identity.

use super::error::FilesError;

/// Response encoding of a download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// As is.
    Identity,
    /// gzip.
    Gzip,
}

/// Picks the response encoding from `Accept-Encoding` (RFC 9110: identity is acceptable unless
/// excluded with `q=0`, explicitly or through `*;q=0`).
pub fn negotiate_encoding(accept: Option<&str>) -> Result<Encoding, FilesError> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(Encoding::Identity);
    };
    let mut codings: Vec<(String, f32)> = accept
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split(';');
            let name = parts.next()?.trim().to_ascii_lowercase();
            if name.is_empty() {
                return None;
            }
            let q = parts
                .filter_map(|p| {
                    p.trim()
                        .strip_prefix("q=")
                        .or_else(|| p.trim().strip_prefix("Q="))
                })
                .find_map(|v| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            Some((name, q))
        })
        .collect();
    codings.sort_by(|a, b| b.1.total_cmp(&a.1));
    let q_of = |name: &str| codings.iter().find(|(n, _)| n == name).map(|(_, q)| *q);
    let identity_ok = match q_of("identity") {
        Some(q) => q > 0.0,
        None => q_of("*").is_none_or(|q| q > 0.0),
    };
    for (name, q) in &codings {
        if *q <= 0.0 {
            continue;
        }
        match name.as_str() {
            "gzip" | "x-gzip" => return Ok(Encoding::Gzip),
            "identity" => return Ok(Encoding::Identity),
            "*" => {
                return Ok(if identity_ok {
                    Encoding::Identity
                } else {
                    Encoding::Gzip
                });
            }
            _ => {}
        }
    }
    if identity_ok {
        Ok(Encoding::Identity)
    } else {
        Err(FilesError::NotAcceptable(format!(
            "no acceptable content encoding in Accept-Encoding {accept:?}; supported: gzip, identity"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding() {
        assert_eq!(negotiate_encoding(None).unwrap(), Encoding::Identity);
        assert_eq!(negotiate_encoding(Some("gzip")).unwrap(), Encoding::Gzip);
        assert_eq!(
            negotiate_encoding(Some("br;q=1, gzip;q=0.5")).unwrap(),
            Encoding::Gzip
        );
        assert_eq!(
            negotiate_encoding(Some("gzip;q=0")).unwrap(),
            Encoding::Identity
        );
        assert_eq!(negotiate_encoding(Some("br")).unwrap(), Encoding::Identity);
        assert_eq!(
            negotiate_encoding(Some("identity;q=0, gzip")).unwrap(),
            Encoding::Gzip
        );
        assert_eq!(
            negotiate_encoding(Some("*;q=0, gzip")).unwrap(),
            Encoding::Gzip
        );
        assert_eq!(negotiate_encoding(Some("*")).unwrap(), Encoding::Identity);
        assert!(matches!(
            negotiate_encoding(Some("br, identity;q=0")),
            Err(FilesError::NotAcceptable(_))
        ));
        assert!(matches!(
            negotiate_encoding(Some("*;q=0")),
            Err(FilesError::NotAcceptable(_))
        ));
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        fn entry() -> impl Strategy<Value = (String, Option<u16>)> {
            (
                prop_oneof![
                    Just("gzip"),
                    Just("x-gzip"),
                    Just("identity"),
                    Just("*"),
                    Just("br"),
                    Just("deflate"),
                    Just("GZip"),
                ],
                prop::option::of(0_u16..=1000),
            )
                .prop_map(|(name, q)| (name.to_owned(), q))
        }

        fn header(entries: &[(String, Option<u16>)]) -> String {
            entries
                .iter()
                .map(|(name, q)| match q {
                    Some(q) => format!("{name};q={}", f32::from(*q) / 1000.0),
                    None => name.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        }

        proptest! {
            #[test]
            fn never_panics(value in any::<String>()) {
                let _ = negotiate_encoding(Some(&value));
            }

            #[test]
            fn answers_follow_the_header(entries in prop::collection::vec(entry(), 0..6)) {
                let text = header(&entries);
                let q = |e: &(String, Option<u16>)| e.1.unwrap_or(1000);
                let named = |name: &str| entries.iter().filter(|e| e.0.eq_ignore_ascii_case(name)).map(q).collect::<Vec<_>>();
                let result = negotiate_encoding(Some(&text));
                // Case does not matter.
                prop_assert_eq!(
                    format!("{:?}", negotiate_encoding(Some(&text.to_ascii_uppercase()))),
                    format!("{result:?}")
                );
                match result {
                    Ok(Encoding::Gzip) => {
                        let offered = [named("gzip"), named("x-gzip"), named("*")].concat();
                        prop_assert!(offered.iter().any(|q| *q > 0), "{text}");
                    }
                    Ok(Encoding::Identity) => {}
                    Err(FilesError::NotAcceptable(_)) => {
                        // Only when identity is excluded, explicitly or through `*`.
                        let identity = named("identity");
                        let excluded = if identity.is_empty() {
                            let any = named("*");
                            !any.is_empty() && any.iter().all(|q| *q == 0)
                        } else {
                            identity.iter().all(|q| *q == 0)
                        };
                        prop_assert!(excluded, "{text}");
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                }
                // gzip preferred over everything else is chosen.
                let gzip_q = [named("gzip"), named("x-gzip")].concat().into_iter().max();
                let others = entries.iter().filter(|e| !["gzip", "x-gzip"].iter().any(|g| e.0.eq_ignore_ascii_case(g))).map(q).max();
                if let Some(g) = gzip_q.filter(|g| *g > 0) && others.is_none_or(|o| o < g) {
                    prop_assert_eq!(negotiate_encoding(Some(&text)).ok(), Some(Encoding::Gzip), "{}", text);
                }
            }
        }
    }
}
