//! Durations as people write them on a command line or in a console filter.

use std::time::Duration;

/// `30s`, `15m`, `36h`, `14d`, `2w`: one whole number and one unit.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit; use s, m, h, d or w, e.g. 14d"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number, e.g. 14d"))?;
    let unit_s = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}; use s, m, h, d or w"
            ));
        }
    };
    n.checked_mul(unit_s)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}
