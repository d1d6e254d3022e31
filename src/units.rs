//! Byte sizes as users type them (`4K`, `256MiB`, `1.5M`) and as we print them. Every size
//! printed parses back to the exact byte count it stands for: a unit with a short fraction only
//! where that is exact (1.125K is 1152), else a smaller unit or plain bytes (1229B).

use crate::error::Error;

/// Binary units, largest first.
const UNITS: [(&str, u64); 4] = [
    ("T", 1 << 40),
    ("G", 1 << 30),
    ("M", 1 << 20),
    ("K", 1 << 10),
];

/// Most fraction digits a printed size has: the refinement points between powers of two are
/// eighths (1.125K), which take three.
const FRACTION_DIGITS: u32 = 3;

/// Parses a byte count: an integer (with B, byte or bytes, as sentences print it), or a
/// decimal with a binary suffix K/KB/KiB, M/MB/MiB,
/// G/GB/GiB, T/TB/TiB (all powers of 1024, as message sizes are in this field). A decimal must
/// name whole bytes: 1.5K is 1536, 1.2K (1228.8) is refused.
pub fn parse_bytes(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let bad = || {
        Error::bad_input(format!(
            "`{s}` is not a byte size; write it like 4096, 4K, 1.5M, 256MiB or 1G"
        ))
    };
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() || (num.contains('.') && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" | "byte" | "bytes" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    let too_big = || {
        Error::bad_input(format!(
            "`{s}` is more bytes than artune can count (at most 16 EiB); give a smaller size"
        ))
    };
    let whole: u64 = whole.parse().map_err(|_| too_big())?;
    let n = whole.checked_mul(mult).ok_or_else(too_big)?;
    // The fraction in u128: at most 38 digits keep 10^digits and the product in range.
    let digits = u32::try_from(frac.len())
        .ok()
        .filter(|&d| d <= 30)
        .ok_or_else(bad)?;
    let frac: u128 = match digits {
        0 => 0,
        _ => frac.parse().map_err(|_| bad())?,
    };
    let scale = 10u128.pow(digits);
    let part = frac * mult as u128;
    if !part.is_multiple_of(scale) {
        return Err(Error::bad_input(format!(
            "`{s}` is not a whole number of bytes; write it in bytes (e.g. {}) or as a fraction that is exact (1.5K is 1536)",
            (n as u128 + part / scale).max(1)
        )));
    }
    u64::try_from(part / scale)
        .ok()
        .and_then(|p| n.checked_add(p))
        .ok_or_else(bad)
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

/// Formats a byte count compactly and exactly: 4096 -> "4K", 1.5 MiB -> "1.5M", 1152 ->
/// "1.125K", 1229 -> "1229B". [`parse_bytes`] reads every result back to `b`.
pub fn fmt_bytes(b: u64) -> String {
    match with_unit(b) {
        Some(s) => s,
        None => format!("{b}B"),
    }
}

/// `b` in the largest unit that shows it exactly with at most [`FRACTION_DIGITS`] decimals.
fn with_unit(b: u64) -> Option<String> {
    UNITS
        .into_iter()
        .filter(|&(_, size)| b >= size)
        .find_map(|(name, size)| {
            (0..=FRACTION_DIGITS).find_map(|d| {
                let scale = 10u128.pow(d);
                let scaled = b as u128 * scale;
                scaled.is_multiple_of(size as u128).then(|| {
                    let v = scaled / size as u128;
                    match d {
                        0 => format!("{v}{name}"),
                        _ => {
                            let (i, f) = (v / scale, v % scale);
                            let f = format!("{f:0w$}", w = d as usize);
                            format!("{i}.{}{name}", f.trim_end_matches('0'))
                        }
                    }
                })
            })
        })
}

/// The largest size at most `b` that a user types in one word: whole units of the largest unit
/// it reaches (5.3G gives 5G), or whole 4-byte elements below 1K (1 for less than 4), so the
/// advice "at most X" is what fits, not only a power of two that does.
pub fn floor_typed(b: u64) -> u64 {
    match UNITS.into_iter().find(|&(_, size)| b >= size) {
        Some((_, size)) => b / size * size,
        None => (b / 4 * 4).max(1),
    }
}

/// A byte count for a sentence: as a user types it ("64K", "1.5M"), else "1537 bytes" (or
/// "1 byte").
pub fn fmt_size(b: u64) -> String {
    with_unit(b).unwrap_or_else(|| match b {
        1 => "1 byte".into(),
        b => format!("{b} bytes"),
    })
}

/// An amount of memory (buffers, registrations, a GPU's memory) for a reading: a tenth of the
/// largest binary unit it reaches ("2.3 MiB", "139.8 GiB"), with a space and the unit spelled
/// out. Memory is read, not typed back, so a reading need not be exact as sizes are.
pub fn fmt_mem(b: u64) -> String {
    let (unit, size) = match b {
        b if b >= 1 << 40 => ("TiB", 1u64 << 40),
        b if b >= 1 << 30 => ("GiB", 1 << 30),
        b if b >= 1 << 20 => ("MiB", 1 << 20),
        b if b >= 1 << 10 => ("KiB", 1 << 10),
        b => return format!("{b} B"),
    };
    format!("{:.1} {unit}", b as f64 / size as f64)
}

/// Two amounts of memory set against each other ("65.8 MiB, more than the 64.0 MiB"): as
/// readings, or as exact byte counts where the readings would read alike.
pub fn fmt_mem_apart(a: u64, b: u64) -> (String, String) {
    match (fmt_mem(a), fmt_mem(b)) {
        (x, y) if x == y && a != b => (format!("{a} bytes"), format!("{b} bytes")),
        pair => pair,
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
        let e = parse_bytes("99999999999999999999").unwrap_err().to_string();
        assert!(e.contains("more bytes than artune can count"), "{e}");
        assert!(parse_bytes("99999999999T").is_err());
    }

    #[test]
    fn parses_ranges() {
        assert_eq!(parse_range("1K:256M").unwrap(), (1024, 256 << 20));
        assert!(parse_range("2K:1K").is_err());
        assert!(parse_range("0:1K").is_err());
        assert!(parse_range("1K").is_err());
    }

    #[test]
    fn a_bound_floors_to_whole_units_of_its_largest_unit() {
        assert_eq!(fmt_size(floor_typed((5 << 30) + (300 << 20))), "5G");
        assert_eq!(floor_typed(4 << 30), 4 << 30);
        assert_eq!(fmt_size(floor_typed((300 << 20) + 5)), "300M");
        assert_eq!(floor_typed(1023), 1020);
        assert_eq!(floor_typed(0), 1);
    }

    #[test]
    fn sizes_in_sentences_read_as_typed_and_stay_exact() {
        assert_eq!(fmt_size(114688), "112K");
        assert_eq!(fmt_size(3 << 20), "3M");
        assert_eq!(fmt_size(1537), "1537 bytes");
        assert_eq!(fmt_size(6), "6 bytes");
        assert_eq!(fmt_size(1), "1 byte");
        assert_eq!(parse_bytes(&fmt_size(64 << 10)).unwrap(), 64 << 10);
    }

    #[test]
    fn fractions_parse_only_where_they_name_whole_bytes() {
        assert_eq!(parse_bytes("1.5K").unwrap(), 1536);
        assert_eq!(parse_bytes("1.125K").unwrap(), 1152);
        assert_eq!(parse_bytes("0.5M").unwrap(), 512 << 10);
        let e = parse_bytes("1.2K").unwrap_err().to_string();
        assert!(
            e.contains("not a whole number of bytes") && e.contains("1228"),
            "{e}"
        );
        // The example offered is a size the flag takes: never 0.
        let e = parse_bytes("0.5").unwrap_err().to_string();
        assert!(e.contains("(e.g. 1)"), "{e}");
        for bad in ["1.", ".5K", "1..5K", "1.5.K", "1.5Q"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    /// The property the printing rests on: every size prints to text that parses back to it,
    /// and the text is short (a unit, or bytes where no unit is exact in 3 decimals).
    #[test]
    fn every_printed_size_parses_back_to_its_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values: Vec<u64> = (1..5000).collect();
        for k in 10..=50 {
            let p = 1u64 << k;
            values.extend([
                p - 1,
                p,
                p + 1,
                p + p / 8,
                p + 3 * p / 8,
                p * 3 / 2,
                p / 10 * 9,
            ]);
        }
        for _ in 0..20000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 40));
        }
        values.extend([u64::MAX, u64::MAX - 1, 1228, 1229, 1280, 5632, 1153434]);
        for b in values {
            for text in [fmt_bytes(b), fmt_size(b)] {
                assert_eq!(parse_bytes(&text).unwrap(), b, "{b} printed as {text}");
            }
        }
        assert_eq!(fmt_bytes(1229), "1229B");
        assert_eq!(fmt_bytes(1280), "1.25K");
        assert_eq!(fmt_bytes(5632), "5.5K");
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(4096), "4K");
        assert_eq!(fmt_bytes(3 << 19), "1.5M");
        assert_eq!(fmt_bytes(100), "100B");
        assert_eq!(fmt_bytes(1152), "1.125K");
        assert_eq!(fmt_bytes((1 << 20) + 1024), "1025K");
        assert_eq!(fmt_us(4.26), "4.3 us");
        assert_eq!(fmt_us(2500.0), "2.50 ms");
    }

    #[test]
    fn memory_reads_as_a_reading_in_the_largest_unit_it_reaches() {
        assert_eq!(fmt_mem(0), "0 B");
        assert_eq!(fmt_mem(512), "512 B");
        assert_eq!(fmt_mem(2_795_776), "2.7 MiB");
        assert_eq!(fmt_mem(96 << 30), "96.0 GiB");
        assert_eq!(fmt_mem(150_000_000_000), "139.7 GiB");
        assert_eq!(fmt_mem(3 << 10), "3.0 KiB");
        assert_eq!(fmt_mem(3 << 40), "3.0 TiB");
        let apart = |a, b| fmt_mem_apart(a, b);
        assert_eq!(
            apart(69_031_466, 64 << 20),
            ("65.8 MiB".into(), "64.0 MiB".into())
        );
        let over = (64 << 20) + 1;
        assert_eq!(
            apart(over, 64 << 20),
            ("67108865 bytes".into(), "67108864 bytes".into())
        );
    }
}
