//! Instants as DATETIME(6) values in UTC (every session's `time_zone` is `+00:00`): the columns
//! are DATETIME, not TIMESTAMP, whose range ends in 2038.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use mysql_async::Value;

use crate::{Error, Result};

/// `t` as a DATETIME(6) parameter (microseconds, as PostgreSQL's timestamptz keeps).
pub(super) fn value(t: Timestamp) -> Value {
    let dt = t.to_zoned(TimeZone::UTC).datetime();
    Value::Date(
        dt.year() as u16,
        dt.month() as u8,
        dt.day() as u8,
        dt.hour() as u8,
        dt.minute() as u8,
        dt.second() as u8,
        (dt.subsec_nanosecond() / 1000) as u32,
    )
}

/// A DATETIME read back: a binary-protocol date, or the text protocol's `YYYY-MM-DD hh:mm:ss`.
pub(super) fn timestamp(v: Value) -> Result<Timestamp> {
    let dt =
        match v {
            Value::Date(y, mo, d, h, mi, s, us) => jiff::civil::date(y as i16, mo as i8, d as i8)
                .at(h as i8, mi as i8, s as i8, us as i32 * 1000),
            Value::Bytes(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.replacen(' ', "T", 1).parse::<DateTime>().ok())
                .ok_or_else(|| Error::Backstop("a DATETIME that does not parse".into()))?,
            other => {
                return Err(Error::Backstop(format!(
                    "expected a DATETIME, got {other:?}"
                )));
            }
        };
    dt.to_zoned(TimeZone::UTC)
        .map(|z| z.timestamp())
        .map_err(|e| Error::Backstop(format!("a DATETIME out of range: {e}")))
}

/// A nullable DATETIME.
pub(super) fn timestamp_opt(v: Value) -> Result<Option<Timestamp>> {
    match v {
        Value::NULL => Ok(None),
        v => timestamp(v).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_round_trip_through_both_protocols() {
        let t: Timestamp = "2027-03-28T01:00:00.123456Z".parse().unwrap();
        assert_eq!(timestamp(value(t)).unwrap(), t);
        let text = Value::Bytes(b"2027-03-28 01:00:00.123456".to_vec());
        assert_eq!(timestamp(text).unwrap(), t);
        let whole = Value::Bytes(b"2040-01-01 00:00:00".to_vec());
        assert_eq!(
            timestamp(whole).unwrap(),
            "2040-01-01T00:00:00Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(timestamp_opt(Value::NULL).unwrap(), None);
        assert!(timestamp(Value::Int(3)).is_err());
    }
}
