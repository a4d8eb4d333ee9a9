//! Parsers of the values people type: durations, file modes, store URLs, and the
//! redaction of URLs for logs. A leaf: it imports nothing from the crate, so the command
//! line, the webhook's annotation checks and the library layers can all use it.

use std::time::Duration;

/// Parses `250ms`, `10s`, `5m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!("{s:?}: a duration cannot be negative"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 250ms, 10s, 5m or 1h"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{s:?}: {e}"))
}

/// A duration the way [`parse_duration`] reads them and people write them: `100ms`,
/// `1.5s`, `30s`, `5m`, `1h30m`. Below a second, whole milliseconds; below a minute,
/// seconds to a tenth; above, whole seconds.
pub fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    if d < Duration::from_secs(60) {
        let tenths = (d.as_secs_f64() * 10.0).round() as u64;
        return match tenths % 10 {
            0 => format!("{}s", tenths / 10),
            t => format!("{}.{t}s", tenths / 10),
        };
    }
    let secs = d.as_secs_f64().round() as u64;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut text = String::new();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if value > 0 {
            text.push_str(&format!("{value}{unit}"));
        }
    }
    text
}

/// Parses an octal file mode like `600` or `0o660`.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode like 600 or 660"))
}

/// A URL with any `user:password@` part replaced, fit for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Where locks are kept, as a `--store` value names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// The embedded memory store.
    Memory,
    /// Redis: standalone (`redis://`, `rediss://`), through Sentinel
    /// (`redis+sentinel://`, `rediss+sentinel://`) or a Cluster (`redis+cluster://`,
    /// `rediss+cluster://`).
    Redis(String),
    /// Redlock over independent masters, `redlock://h1:p1,h2:p2,h3:p3`.
    Redlock(String),
}

impl std::str::FromStr for StoreSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory" {
            return Ok(Self::Memory);
        }
        let redis = [
            "redis://",
            "rediss://",
            "redis+sentinel://",
            "rediss+sentinel://",
            "redis+cluster://",
            "rediss+cluster://",
        ];
        if redis.iter().any(|scheme| s.starts_with(scheme)) {
            return Ok(Self::Redis(s.to_owned()));
        }
        if s.starts_with("redlock://") {
            return Ok(Self::Redlock(s.to_owned()));
        }
        Err(format!(
            "{:?} is not a store: use memory, redis://HOST:PORT or rediss://HOST:PORT",
            redact(s)
        ))
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) | Self::Redlock(url) => f.write_str(&redact(url)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_people_write_them_and_parse_back() {
        for (d, text) in [
            (Duration::ZERO, "0ms"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(5400), "1h30m"),
            (Duration::from_secs(24 * 3600), "24h"),
            (Duration::from_secs(3661), "1h1m1s"),
        ] {
            assert_eq!(format_duration(d), text);
            // One unit: `hold --wait` reads it back.
            let one_unit = !text
                .trim_end_matches(char::is_alphabetic)
                .contains(char::is_alphabetic);
            if one_unit {
                assert_eq!(parse_duration(text), Ok(d), "{text}");
            }
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("10d").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn modes_parse() {
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0o660"), Ok(0o660));
        assert!(parse_mode("800").is_err());
        assert!(parse_mode("7777").is_err());
    }

    #[test]
    fn stores_parse_and_redact() {
        assert_eq!("memory".parse(), Ok(StoreSpec::Memory));
        assert!(matches!("redis://h:1".parse(), Ok(StoreSpec::Redis(_))));
        assert!(matches!(
            "redis+sentinel://a:1,b:2/m".parse(),
            Ok(StoreSpec::Redis(_))
        ));
        assert!(matches!(
            "redlock://a,b,c".parse(),
            Ok(StoreSpec::Redlock(_))
        ));
        let shown = StoreSpec::Redlock("redlock://u:pw@a,b,c".into()).to_string();
        assert!(!shown.contains("pw"));
        assert!("mysql://x".parse::<StoreSpec>().is_err());
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        let shown = StoreSpec::Redis("rediss://:pw@h:1".into()).to_string();
        assert!(!shown.contains("pw"));
    }
}
