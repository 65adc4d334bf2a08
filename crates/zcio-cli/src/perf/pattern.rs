//! The verification pattern: byte `o` of a stream is byte `o % 8` (little-endian) of the
//! 64-bit word `(o / 8) ^ SEED`. Cheap to fill and to check at any offset.

const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

fn word(i: u64) -> u64 {
    i.wrapping_mul(SEED) ^ SEED
}

/// Fills `buf` with the stream pattern starting at stream offset `off`.
pub fn fill(buf: &mut [u8], off: u64) {
    let mut o = off;
    let mut i = 0;
    while i < buf.len() && o % 8 != 0 {
        buf[i] = word(o / 8).to_le_bytes()[(o % 8) as usize];
        i += 1;
        o += 1;
    }
    let mut chunks = buf[i..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&word(o / 8).to_le_bytes());
        o += 8;
    }
    for b in chunks.into_remainder() {
        *b = word(o / 8).to_le_bytes()[(o % 8) as usize];
        o += 1;
    }
}

/// Checks `buf` against the pattern at `off`; `Err(offset)` of the first wrong byte.
pub fn check(buf: &[u8], off: u64) -> Result<(), u64> {
    let mut o = off;
    let mut i = 0;
    while i < buf.len() && o % 8 != 0 {
        if buf[i] != word(o / 8).to_le_bytes()[(o % 8) as usize] {
            return Err(o);
        }
        i += 1;
        o += 1;
    }
    let mut chunks = buf[i..].chunks_exact(8);
    for c in &mut chunks {
        if c != word(o / 8).to_le_bytes() {
            let k = c
                .iter()
                .zip(word(o / 8).to_le_bytes())
                .position(|(a, b)| *a != b)
                .unwrap_or(0);
            return Err(o + k as u64);
        }
        o += 8;
    }
    for &b in chunks.remainder() {
        if b != word(o / 8).to_le_bytes()[(o % 8) as usize] {
            return Err(o);
        }
        o += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_checks_at_any_split_and_finds_the_bad_byte() {
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, 13);
        let mut parts = vec![0u8; 1000];
        fill(&mut parts[..101], 13);
        fill(&mut parts[101..], 114);
        assert_eq!(whole, parts);
        assert_eq!(check(&whole[5..77], 18), Ok(()));
        whole[500] ^= 1;
        assert_eq!(check(&whole, 13), Err(513));
    }
}
