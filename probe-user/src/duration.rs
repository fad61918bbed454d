//! Durations as people write them (`1s`, `500ms`, `2m`): flags, the config file, feature
//! windows and label horizons. At the bottom: it imports nothing of probe's.
use std::time::Duration;

/// Parses `1s`, `500ms`, `2m`, `1.5s`; zero is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration like 1s or 500ms ({e})"))?;
    if d.is_zero() {
        return Err(format!("`{s}` must be greater than zero"));
    }
    Ok(d)
}

/// A window's name in feature names: `5s`, `120s`, `500ms`.
pub fn label(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
