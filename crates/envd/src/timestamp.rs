//! `google.protobuf.Timestamp`: the message is generated from the well-known type's .proto (in
//! [`crate::google::protobuf`]), its JSON form is written here. The proto3 JSON mapping wants an
//! RFC 3339 string in UTC ending in `Z` with 0, 3, 6 or 9 fractional digits, which is what envd
//! sends (`pbjson-types` would write `+00:00`, a form the SDKs' parsers need not accept).
//! Input may carry any offset.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::google::protobuf::Timestamp;

impl Timestamp {
    /// Converts a [`std::time::SystemTime`] (which may lie before the epoch).
    pub fn from_system_time(time: std::time::SystemTime) -> Self {
        match time.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Self {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
            },
            Err(e) => {
                let d = e.duration();
                let mut seconds = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                let mut nanos = i32::try_from(d.subsec_nanos()).unwrap_or(0);
                if nanos > 0 {
                    seconds -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Self { seconds, nanos }
            }
        }
    }

    /// Converts to a chrono UTC date-time, if representable.
    pub fn to_datetime(self) -> Option<chrono::DateTime<chrono::Utc>> {
        chrono::DateTime::from_timestamp(self.seconds, u32::try_from(self.nanos).ok()?)
    }

    /// Converts from a chrono date-time.
    pub fn from_datetime<Tz: chrono::TimeZone>(dt: &chrono::DateTime<Tz>) -> Self {
        Self {
            seconds: dt.timestamp(),
            nanos: i32::try_from(dt.timestamp_subsec_nanos()).unwrap_or(0),
        }
    }

    /// Renders the canonical proto3 JSON form: RFC 3339, `Z`, and 0, 3, 6 or 9 fractional digits.
    pub fn to_rfc3339(self) -> Option<String> {
        self.to_datetime()
            .map(|dt| dt.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
    }

    /// Parses an RFC 3339 timestamp with any offset.
    pub fn parse_rfc3339(text: &str) -> Result<Self, chrono::ParseError> {
        chrono::DateTime::parse_from_rfc3339(text).map(|dt| Self::from_datetime(&dt))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.to_rfc3339() {
            Some(text) => s.serialize_str(&text),
            None => Err(serde::ser::Error::custom(format!(
                "Timestamp {}s {}ns is out of range",
                self.seconds, self.nanos
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Rfc3339;
        impl Visitor<'_> for Rfc3339 {
            type Value = Timestamp;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an RFC 3339 timestamp string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Timestamp, E> {
                Timestamp::parse_rfc3339(text)
                    .map_err(|e| E::custom(format!("Invalid RFC 3339 timestamp {text:?}: {e}")))
            }
        }
        d.deserialize_str(Rfc3339)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_in_canonical_form() {
        let t = Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        };
        assert_eq!(t.to_rfc3339().unwrap(), "2023-11-14T22:13:20Z");
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"2023-11-14T22:13:20Z\""
        );
        let t = Timestamp {
            seconds: 1_700_000_000,
            nanos: 120_000_000,
        };
        assert_eq!(t.to_rfc3339().unwrap(), "2023-11-14T22:13:20.120Z");
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T23:13:20.12+01:00").unwrap(),
            t
        );
        assert_eq!(
            serde_json::from_str::<Timestamp>("\"2023-11-14T23:13:20.12+01:00\"").unwrap(),
            t
        );
        assert!(serde_json::from_str::<Timestamp>("\"yesterday\"").is_err());
        assert!(serde_json::from_str::<Timestamp>("5").is_err());
        let before = std::time::UNIX_EPOCH - std::time::Duration::from_millis(1500);
        assert_eq!(
            Timestamp::from_system_time(before),
            Timestamp {
                seconds: -2,
                nanos: 500_000_000
            }
        );
    }

    #[test]
    fn out_of_range_timestamps_fail_to_encode() {
        let t = Timestamp {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert!(serde_json::to_string(&t).is_err());
    }
}
