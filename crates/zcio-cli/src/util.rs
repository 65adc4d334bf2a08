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

#[cfg(test)]
mod tests {
    use super::parse_size;

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
