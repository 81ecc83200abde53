//! proto3 JSON mapping helpers.
//!
//! The envd protocol is spoken as Connect with the JSON codec, so every message follows the
//! [proto3 JSON mapping](https://protobuf.dev/programming-guides/json/):
//!
//! - field names are lowerCamelCase on output; parsers accept the original snake_case name too
//!   (done with `#[serde(alias = ...)]` on the message types);
//! - `int64`/`uint64` are strings on output and either strings or numbers on input;
//! - 32-bit integers are numbers on output and either numbers or strings on input;
//! - `bytes` are standard base64 with padding on output; input may be standard or URL-safe
//!   base64, with or without padding;
//! - enums are their value names on output; input may be a name or a number;
//! - `null` means "the default value" for every field type;
//! - unknown fields are ignored.
//!
//! The modules below are used with `#[serde(with = "...")]` and
//! `#[serde(deserialize_with = "...")]` on the message types in [`crate::process`] and
//! [`crate::filesystem`].

use std::fmt;

use base64::Engine as _;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Deserializes a field whose JSON value may be `null`, mapping `null` to the type's default.
pub fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Plain serde passthrough, used by the oneof macro for message and string members.
pub mod plain {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Serializes `value` with its own `Serialize` impl.
    pub fn serialize<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        value.serialize(s)
    }

    /// Deserializes with the type's own `Deserialize` impl.
    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        T::deserialize(d)
    }
}

/// Visitor that accepts an integer as a JSON number, a numeric string or `null` (→ 0).
struct IntVisitor<T>(std::marker::PhantomData<T>);

impl<T> IntVisitor<T> {
    const fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<'de, T> Visitor<'de> for IntVisitor<T>
where
    T: TryFrom<i128> + Default,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an integer (as a JSON number or a string)")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        T::try_from(i128::from(v)).map_err(|_| E::custom(format!("integer {v} is out of range")))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::try_from(i128::from(v)).map_err(|_| E::custom(format!("integer {v} is out of range")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        // proto3 JSON allows exponent notation such as `1e3` as long as the value is integral.
        if v.fract() != 0.0 || !v.is_finite() || v.abs() > 1.0e30 {
            return Err(E::custom(format!("{v} is not an integer")));
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "checked to be integral and in range"
        )]
        let as_int = v as i128;
        T::try_from(as_int).map_err(|_| E::custom(format!("integer {v} is out of range")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        let trimmed = v.trim();
        if let Ok(n) = trimmed.parse::<i128>() {
            return T::try_from(n).map_err(|_| E::custom(format!("integer {v} is out of range")));
        }
        match trimmed.parse::<f64>() {
            Ok(f) => self.visit_f64(f),
            Err(_) => Err(E::custom(format!("{v:?} is not an integer"))),
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! int_module {
    ($(#[$doc:meta])* $name:ident, $ty:ty, as_string = $as_string:expr) => {
        $(#[$doc])*
        pub mod $name {
            use serde::{Deserializer, Serializer};

            /// Serializes the integer in its canonical proto3 JSON form.
            #[allow(clippy::trivially_copy_pass_by_ref, reason = "serde `with` signature")]
            pub fn serialize<S: Serializer>(value: &$ty, s: S) -> Result<S::Ok, S::Error> {
                if $as_string {
                    s.collect_str(value)
                } else {
                    serde::Serialize::serialize(value, s)
                }
            }

            /// Accepts a JSON number, a numeric string or `null`.
            pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                d.deserialize_any(super::IntVisitor::<$ty>::new())
            }
        }
    };
}

int_module!(
    /// `uint32`: a number on output; number or string on input.
    uint32, u32, as_string = false
);
int_module!(
    /// `int32` / `sint32`: a number on output; number or string on input.
    int32, i32, as_string = false
);
int_module!(
    /// `int64`: a string on output; number or string on input.
    int64, i64, as_string = true
);
int_module!(
    /// `uint64`: a string on output; number or string on input.
    uint64, u64, as_string = true
);

/// Decodes proto3 JSON `bytes`: standard or URL-safe alphabet, padded or not.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::DecodePaddingMode;
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};

    const CONFIG: GeneralPurposeConfig = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    const STANDARD: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, CONFIG);
    const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, CONFIG);

    if text.contains(['-', '_']) {
        URL_SAFE.decode(text)
    } else {
        STANDARD.decode(text)
    }
}

/// Encodes proto3 JSON `bytes`: standard alphabet with padding.
pub fn encode_base64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// `bytes` fields as [`bytes::Bytes`].
pub mod bytes_b64 {
    use std::fmt;

    use bytes::Bytes;
    use serde::Serializer;
    use serde::de::{self, Deserializer, Visitor};

    /// Serializes as standard padded base64.
    pub fn serialize<S: Serializer>(value: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::encode_base64(value))
    }

    /// Accepts standard or URL-safe base64, padded or not, or `null` (empty).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct B64;
        impl<'de> Visitor<'de> for B64 {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a base64 string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Bytes, E> {
                super::decode_base64(v)
                    .map(Bytes::from)
                    .map_err(|e| E::custom(format!("invalid base64 in bytes field: {e}")))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Bytes, E> {
                Ok(Bytes::new())
            }
            fn visit_none<E: de::Error>(self) -> Result<Bytes, E> {
                Ok(Bytes::new())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Bytes, D::Error> {
                d.deserialize_any(self)
            }
        }
        d.deserialize_any(B64)
    }
}

/// A `google.protobuf.Timestamp`, carried in JSON as an RFC 3339 string in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    /// Seconds since the Unix epoch.
    pub seconds: i64,
    /// Non-negative fraction of a second, `0..1_000_000_000`.
    pub nanos: i32,
}

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
                "timestamp {}s {}ns is out of range",
                self.seconds, self.nanos
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse_rfc3339(&text)
            .map_err(|e| de::Error::custom(format!("invalid RFC 3339 timestamp {text:?}: {e}")))
    }
}

/// Declares a proto3 enum: named values on output, names or numbers on input, and unknown
/// values mapped to the zero (`*_UNSPECIFIED`) value, as a lenient proto3 JSON parser does when
/// it ignores unknown fields.
#[macro_export]
#[doc(hidden)]
macro_rules! proto_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $(#[$zdoc:meta])* $zero:ident = 0 => $zname:literal,
            $($(#[$vdoc:meta])* $variant:ident = $value:literal => $vname:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[repr(i32)]
        pub enum $name {
            $(#[$zdoc])*
            #[default]
            $zero = 0,
            $($(#[$vdoc])* $variant = $value,)*
        }

        impl $name {
            /// All values, in declaration order.
            pub const ALL: &'static [$name] = &[$name::$zero, $($name::$variant,)*];

            /// The proto value name, e.g. `FILE_TYPE_FILE`.
            pub const fn as_str_name(self) -> &'static str {
                match self {
                    $name::$zero => $zname,
                    $($name::$variant => $vname,)*
                }
            }

            /// Looks a value up by its proto name.
            pub fn from_str_name(name: &str) -> Option<Self> {
                match name {
                    $zname => Some($name::$zero),
                    $($vname => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// Looks a value up by its number.
            pub const fn from_i32(value: i32) -> Option<Self> {
                match value {
                    0 => Some($name::$zero),
                    $($value => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The proto number.
            pub const fn as_i32(self) -> i32 {
                self as i32
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str_name())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str_name())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> ::serde::de::Visitor<'de> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter) -> ::std::fmt::Result {
                        write!(f, concat!("a ", stringify!($name), " name or number"))
                    }
                    fn visit_str<E: ::serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        Ok($name::from_str_name(v).unwrap_or_default())
                    }
                    fn visit_i64<E: ::serde::de::Error>(self, v: i64) -> Result<$name, E> {
                        Ok(i32::try_from(v).ok().and_then($name::from_i32).unwrap_or_default())
                    }
                    fn visit_u64<E: ::serde::de::Error>(self, v: u64) -> Result<$name, E> {
                        Ok(i32::try_from(v).ok().and_then($name::from_i32).unwrap_or_default())
                    }
                    fn visit_unit<E: ::serde::de::Error>(self) -> Result<$name, E> {
                        Ok($name::default())
                    }
                    fn visit_none<E: ::serde::de::Error>(self) -> Result<$name, E> {
                        Ok($name::default())
                    }
                    fn visit_some<D: ::serde::Deserializer<'de>>(self, d: D) -> Result<$name, D::Error> {
                        d.deserialize_any(self)
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

/// Implements proto3 JSON for a message that consists of a single `oneof`, represented in Rust
/// as a struct with one `Option<Enum>` field. On output the set member appears under its
/// lowerCamelCase name (nothing when unset); on input unknown keys are ignored, `null` members
/// count as unset, and two set members are an error.
#[macro_export]
#[doc(hidden)]
macro_rules! proto_oneof {
    (
        $msg:ident . $field:ident : $oneof:ty {
            $($variant:ident ( $ty:ty ) = $json:literal with $with:path,)+
        }
    ) => {
        impl ::serde::Serialize for $msg {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ::serde::ser::SerializeMap as _;
                type Oneof = $oneof;
                let mut map = s.serialize_map(Some(usize::from(self.$field.is_some())))?;
                match &self.$field {
                    None => {}
                    $(Some(Oneof::$variant(value)) => {
                        struct W<'a>(&'a $ty);
                        impl ::serde::Serialize for W<'_> {
                            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                                use $with as with;
                                with::serialize(self.0, s)
                            }
                        }
                        map.serialize_entry($json, &W(value))?;
                    })+
                }
                map.end()
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $msg {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> ::serde::de::Visitor<'de> for V {
                    type Value = $msg;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter) -> ::std::fmt::Result {
                        write!(f, concat!("a ", stringify!($msg), " object"))
                    }
                    fn visit_unit<E: ::serde::de::Error>(self) -> Result<$msg, E> {
                        Ok($msg { $field: None })
                    }
                    fn visit_map<A: ::serde::de::MapAccess<'de>>(self, mut map: A) -> Result<$msg, A::Error> {
                        type Oneof = $oneof;
                        let mut found: Option<Oneof> = None;
                        while let Some(key) = map.next_key::<::std::string::String>()? {
                            match key.as_str() {
                                $($json => {
                                    struct W($ty);
                                    impl<'de> ::serde::Deserialize<'de> for W {
                                        fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                                            use $with as with;
                                            with::deserialize(d).map(W)
                                        }
                                    }
                                    if let Some(W(value)) = map.next_value::<Option<W>>()? {
                                        if found.is_some() {
                                            return Err(::serde::de::Error::custom(concat!(
                                                "more than one member of oneof `",
                                                stringify!($field),
                                                "` is set in ",
                                                stringify!($msg)
                                            )));
                                        }
                                        found = Some(Oneof::$variant(value));
                                    }
                                })+
                                _ => {
                                    map.next_value::<::serde::de::IgnoredAny>()?;
                                }
                            }
                        }
                        Ok($msg { $field: found })
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq, Default)]
    #[serde(default)]
    struct Ints {
        #[serde(with = "uint32")]
        a: u32,
        #[serde(with = "int64")]
        b: i64,
        #[serde(with = "int32")]
        c: i32,
        #[serde(with = "bytes_b64")]
        d: bytes::Bytes,
    }

    #[test]
    fn integers_accept_numbers_and_strings() {
        let v: Ints = serde_json::from_str(r#"{"a":"7","b":12,"c":"-3","d":null}"#).unwrap();
        assert_eq!(
            v,
            Ints {
                a: 7,
                b: 12,
                c: -3,
                d: bytes::Bytes::new()
            }
        );
        let v: Ints = serde_json::from_str(r#"{"a":1e2,"b":"-9","c":null}"#).unwrap();
        assert_eq!((v.a, v.b, v.c), (100, -9, 0));
        assert!(serde_json::from_str::<Ints>(r#"{"a":-1}"#).is_err());
        assert!(serde_json::from_str::<Ints>(r#"{"a":1.5}"#).is_err());
        assert!(serde_json::from_str::<Ints>(r#"{"a":"x"}"#).is_err());
    }

    #[test]
    fn int64_is_a_string_on_output() {
        let v = Ints {
            a: 1,
            b: 1 << 40,
            c: -2,
            d: bytes::Bytes::from_static(b"hi"),
        };
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"a":1,"b":"1099511627776","c":-2,"d":"aGk="})
        );
    }

    #[test]
    fn base64_accepts_all_alphabets_and_padding() {
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
        assert_eq!(decode_base64("-_8").unwrap(), [0xfb, 0xff]);
        assert_eq!(decode_base64("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(decode_base64("!!").is_err());
    }

    #[test]
    fn timestamps_round_trip_in_canonical_form() {
        let t = Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        };
        assert_eq!(t.to_rfc3339().unwrap(), "2023-11-14T22:13:20Z");
        let t = Timestamp {
            seconds: 1_700_000_000,
            nanos: 120_000_000,
        };
        assert_eq!(t.to_rfc3339().unwrap(), "2023-11-14T22:13:20.120Z");
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T23:13:20.12+01:00").unwrap(),
            t
        );
        let before = std::time::UNIX_EPOCH - std::time::Duration::from_millis(1500);
        assert_eq!(
            Timestamp::from_system_time(before),
            Timestamp {
                seconds: -2,
                nanos: 500_000_000
            }
        );
    }
}
