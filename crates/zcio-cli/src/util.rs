//! Argument parsing helpers.

/// Parses a byte size: `4096`, `4K`, `64k`, `1M`, `2G` (binary multiples).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1usize << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'B' => 1,
                _ => {
                    return Err(format!(
                        "bad size '{s}': unknown suffix '{c}' (use K, M or G)"
                    ))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("bad size '{s}': expected a number with optional K/M/G suffix"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("bad size '{s}': too large"))
}

/// A duration option in seconds: finite and more than 0 (`Duration::from_secs_f64` panics on
/// a negative or non-finite number; a duration of 0 would end before anything ran). The
/// error is one line naming the option, as tcpdump's.
pub fn seconds(opt: &str, s: f64) -> anyhow::Result<std::time::Duration> {
    if !(s.is_finite() && s > 0.0) {
        anyhow::bail!("{opt}: invalid duration {s} (seconds, more than 0)");
    }
    std::time::Duration::try_from_secs_f64(s)
        .map_err(|e| anyhow::anyhow!("{opt}: invalid duration {s}: {e}"))
}

/// An interval option in seconds where 0 means "none" (`--stats-interval 0`).
pub fn interval(opt: &str, s: f64) -> anyhow::Result<Option<std::time::Duration>> {
    if s == 0.0 {
        return Ok(None);
    }
    seconds(opt, s).map(Some)
}

/// A count or size option that must be at least 1 (tcpdump rejects `-c 0`, `-C 0`, `-B 0`).
pub fn at_least_one<T: PartialOrd + From<u8> + std::fmt::Display>(
    opt: &str,
    what: &str,
    v: T,
) -> anyhow::Result<T> {
    if v < T::from(1) {
        anyhow::bail!("{opt}: invalid {what} {v} (at least 1)");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::{at_least_one, parse_size, seconds};

    #[test]
    fn durations_and_counts_out_of_range_are_one_line_errors() {
        assert!(seconds("--duration", 1.5).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            let e = seconds("--duration", bad).unwrap_err().to_string();
            assert!(
                e.starts_with("--duration: invalid duration") && !e.contains('\n'),
                "{e}"
            );
        }
        assert_eq!(at_least_one("-c", "packet count", 5u64).unwrap(), 5);
        assert_eq!(
            at_least_one("-c", "packet count", 0u64)
                .unwrap_err()
                .to_string(),
            "-c: invalid packet count 0 (at least 1)"
        );
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("").is_err());
    }
}
