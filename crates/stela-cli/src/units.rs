//! One spelling of sizes and durations for every flag of the `stela` command, its config file
//! and the defaults it prints: sizes as `512KiB`, `64MiB`, `200MB` (the bytesize crate's units),
//! durations as `50ms`, `2s`, `1h` (the humantime crate's).
//!
//! Invariants: what [`Size`] and [`Dur`] print, they parse back to the same value (printed
//! settings are a config file); a bare number keeps meaning what it meant before units were
//! accepted (bytes for sizes; the flag's old unit for durations, given by the parser a flag
//! uses), so scripts written for the old flags keep working.

use std::fmt;
use std::time::Duration;

/// A size in bytes. Prints in the largest binary unit that holds it exactly (`512KiB`,
/// `64MiB`), else the largest decimal one (`200MB`), else in bytes (`123B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    pub fn get(self) -> u64 {
        self.0
    }

    /// As a `usize` (the daemon's in-memory sizes); saturates on a 32-bit target.
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
        for (name, shift) in UNITS {
            let unit = 1u64 << shift;
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{name}", self.0 / unit);
            }
        }
        const DECIMAL: [(&str, u64); 3] = [("GB", 1_000_000_000), ("MB", 1_000_000), ("KB", 1_000)];
        for (name, unit) in DECIMAL {
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{name}", self.0 / unit);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl serde::Serialize for Size {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Why a flag's value is not a size or a duration (clap prints it after the flag's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnitError {
    #[error("{0} is too large")]
    TooLarge(String),
    #[error("{0:?} is not a size (e.g. 4096, 512KiB, 64MiB, 200MB, 1GiB)")]
    NotASize(String),
    #[error("{text:?} is not a duration (e.g. 50ms, 2s, 1m): {source}")]
    NotADuration {
        text: String,
        source: humantime::DurationError,
    },
}

/// Parses a size: a bare number of bytes, bytesize's units (`512KiB`, `1.5MiB`, `200MB`,
/// `4 GB`; `KB`, `MB`, `GB` are decimal, `KiB`, `MiB`, `GiB` binary), and the single letters
/// `K`, `M`, `G`, `T`, which stela always read as binary and still does.
pub fn parse_size(text: &str) -> Result<Size, UnitError> {
    let trimmed = text.trim();
    if let Ok(bytes) = trimmed.parse::<u64>() {
        return Ok(Size(bytes));
    }
    let digits = trimmed.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let legacy_shift = match &trimmed[digits.len()..] {
        "K" | "k" => Some(10),
        "M" => Some(20),
        "G" => Some(30),
        "T" => Some(40),
        _ => None,
    };
    if let (Some(shift), Ok(number)) = (legacy_shift, digits.trim().parse::<u64>()) {
        return number
            .checked_mul(1 << shift)
            .map(Size)
            .ok_or_else(|| UnitError::TooLarge(trimmed.to_owned()));
    }
    trimmed
        .parse::<bytesize::ByteSize>()
        .map(|size| Size(size.as_u64()))
        .map_err(|_| UnitError::NotASize(trimmed.to_owned()))
}

/// A rate in bytes per second: a size, optionally followed by `/s` (`200MB/s`, `200MB`).
pub fn parse_rate(text: &str) -> Result<Size, UnitError> {
    parse_size(text.trim().trim_end_matches("/s"))
}

/// A duration. Prints as humantime does (`50ms`, `1s`, `1h`), which it parses back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl serde::Serialize for Dur {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

fn parse_duration_or(text: &str, bare: fn(u64) -> Duration) -> Result<Dur, UnitError> {
    let trimmed = text.trim();
    if let Ok(number) = trimmed.parse::<u64>() {
        return Ok(Dur(bare(number)));
    }
    humantime::parse_duration(trimmed)
        .map(Dur)
        .map_err(|source| UnitError::NotADuration {
            text: trimmed.to_owned(),
            source,
        })
}

/// A duration whose bare number is milliseconds (the old `--flush-interval 1000`).
pub fn parse_ms(text: &str) -> Result<Dur, UnitError> {
    parse_duration_or(text, Duration::from_millis)
}

/// A duration whose bare number is seconds (the old `--idle-timeout 3600`).
pub fn parse_secs(text: &str) -> Result<Dur, UnitError> {
    parse_duration_or(text, Duration::from_secs)
}

/// A duration whose bare number is microseconds (the old `--spin-us 50`).
pub fn parse_us(text: &str) -> Result<Dur, UnitError> {
    parse_duration_or(text, Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_every_spelling_and_print_back() {
        assert_eq!(parse_size("4096"), Ok(Size(4096)));
        assert_eq!(parse_size("512KiB"), Ok(Size(512 << 10)));
        assert_eq!(parse_size("512K"), Ok(Size(512 << 10)));
        assert_eq!(parse_size("2M"), Ok(Size(2 << 20)));
        assert_eq!(parse_size("64MiB"), Ok(Size(64 << 20)));
        assert_eq!(parse_size("200MB"), Ok(Size(200_000_000)));
        assert_eq!(parse_size("1 GiB"), Ok(Size(1 << 30)));
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_rate("200MB/s"), Ok(Size(200_000_000)));
        assert_eq!(Size(512 << 10).to_string(), "512KiB");
        assert_eq!(Size(64 << 20).to_string(), "64MiB");
        assert_eq!(Size(200_000_000).to_string(), "200MB");
        assert_eq!(Size(123).to_string(), "123B");
        assert_eq!(Size(0).to_string(), "0B");
        for size in [0, 1, 1000, 4096, 200_000_000, 512 << 10, 3 << 30, 5 << 40] {
            let printed = Size(size).to_string();
            assert_eq!(parse_size(&printed), Ok(Size(size)), "{printed}");
        }
    }

    #[test]
    fn durations_take_units_and_a_bare_number_keeps_its_old_unit() {
        assert_eq!(parse_ms("50"), Ok(Dur(Duration::from_millis(50))));
        assert_eq!(parse_secs("50"), Ok(Dur(Duration::from_secs(50))));
        assert_eq!(parse_us("50"), Ok(Dur(Duration::from_micros(50))));
        for parse in [parse_ms, parse_secs, parse_us] {
            assert_eq!(parse("2s"), Ok(Dur(Duration::from_secs(2))));
            assert_eq!(parse("50ms"), Ok(Dur(Duration::from_millis(50))));
            assert_eq!(parse("50us"), Ok(Dur(Duration::from_micros(50))));
            assert!(parse("soon").is_err());
        }
        assert_eq!(Dur(Duration::from_millis(50)).to_string(), "50ms");
        assert_eq!(Dur(Duration::from_secs(3600)).to_string(), "1h");
        assert_eq!(Dur(Duration::ZERO).to_string(), "0s");
        for d in [0, 1, 50, 1000, 1500, 3_600_000] {
            let printed = Dur(Duration::from_millis(d)).to_string();
            assert_eq!(
                parse_secs(&printed),
                Ok(Dur(Duration::from_millis(d))),
                "{printed}"
            );
        }
    }
}
