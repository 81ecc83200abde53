//! Wall-clock helpers: the engine keeps times as Unix milliseconds (as the store does) and
//! hands out `DateTime<Utc>`.

use chrono::{DateTime, TimeZone, Utc};

pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

pub(crate) fn ms_to_dt(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}
