//! Report timestamps: RFC 3339 in UTC, to the second.

use std::time::{SystemTime, UNIX_EPOCH};

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `time` as `2024-05-01T12:00:00Z`.
///
/// Times RFC 3339 cannot express (beyond year 9999, or out of the `time`
/// crate's range) fall back to `@SECONDS` since the epoch rather than failing
/// a whole report over its header.
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let seconds = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        // Round towards the past, as the non-negative branch does.
        Err(before) => {
            let d = before.duration();
            let whole = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            -whole - i64::from(d.subsec_nanos() > 0)
        }
    };
    OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("@{seconds}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_seconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_714_564_800_999);
        assert_eq!(rfc3339(t), "2024-05-01T12:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let before = UNIX_EPOCH - Duration::from_millis(500);
        assert_eq!(rfc3339(before), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn out_of_range_falls_back_to_epoch_seconds() {
        let far = UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        assert_eq!(rfc3339(far), "@400000000000");
    }
}
