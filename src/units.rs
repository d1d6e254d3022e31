//! Byte sizes as users type them (`4K`, `256MiB`, `1G`) and as we print them.

use crate::error::Error;

/// Parses a byte count: a plain integer or one with a binary suffix K/KB/KiB, M/MB/MiB, G/GB/GiB
/// (all powers of 1024, as message sizes are in this field).
pub fn parse_bytes(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let bad = || {
        Error::bad_input(format!(
            "`{s}` is not a byte size; write it like 4096, 4K, 256MiB or 1G"
        ))
    };
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// Parses `LOW:HIGH` into an inclusive range of byte sizes.
pub fn parse_range(s: &str) -> Result<(u64, u64), Error> {
    let (lo, hi) = s.split_once(':').ok_or_else(|| {
        Error::bad_input(format!(
            "`{s}` is not a size range; write it as LOW:HIGH, e.g. 1K:256M"
        ))
    })?;
    let (lo, hi) = (parse_bytes(lo)?, parse_bytes(hi)?);
    if lo == 0 || lo > hi {
        return Err(Error::bad_input(format!(
            "size range `{s}` is empty; LOW must be at least 1 byte and not above HIGH"
        )));
    }
    Ok((lo, hi))
}

/// Formats a byte count compactly with a binary unit: 4096 -> "4K", 1.5 MiB -> "1.5M".
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("", 1)];
    for (name, size) in UNITS {
        if b >= size && size > 1 {
            let v = b as f64 / size as f64;
            return if b % size == 0 {
                format!("{}{name}", b / size)
            } else {
                format!("{v:.1}{name}")
            };
        }
    }
    format!("{b}B")
}

/// A byte count for a sentence: as a user types it where that is exact ("64K", "3M"), else
/// exact with the short form beside it ("1537 bytes, about 1.5K"); below 1 KiB, "100 bytes".
pub fn fmt_size(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    match UNITS.into_iter().find(|(_, size)| b >= *size) {
        Some((name, size)) if b % size == 0 => format!("{}{name}", b / size),
        Some(_) => format!("{b} bytes, about {}", fmt_bytes(b)),
        None => format!("{b} bytes"),
    }
}

/// Formats microseconds with a sensible unit.
pub fn fmt_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else if us >= 100.0 {
        format!("{us:.0} us")
    } else {
        format!("{us:.1} us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("4K").unwrap(), 4096);
        assert_eq!(parse_bytes("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("1g").unwrap(), 1 << 30);
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("99999999999999999999T").is_err());
    }

    #[test]
    fn parses_ranges() {
        assert_eq!(parse_range("1K:256M").unwrap(), (1024, 256 << 20));
        assert!(parse_range("2K:1K").is_err());
        assert!(parse_range("0:1K").is_err());
        assert!(parse_range("1K").is_err());
    }

    #[test]
    fn sizes_in_sentences_read_as_typed_and_stay_exact() {
        assert_eq!(fmt_size(114688), "112K");
        assert_eq!(fmt_size(3 << 20), "3M");
        assert_eq!(fmt_size(1537), "1537 bytes, about 1.5K");
        assert_eq!(fmt_size(6), "6 bytes");
        assert_eq!(parse_bytes(&fmt_size(64 << 10)).unwrap(), 64 << 10);
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(4096), "4K");
        assert_eq!(fmt_bytes(3 << 19), "1.5M");
        assert_eq!(fmt_bytes(100), "100B");
        assert_eq!(fmt_us(4.26), "4.3 us");
        assert_eq!(fmt_us(2500.0), "2.50 ms");
    }
}
