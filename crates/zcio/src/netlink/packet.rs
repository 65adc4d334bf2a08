//! The packet a queue hands over, from its network header on: where its transport header is
//! ([`locate`]), and making a rewritten packet consistent again before it goes back to the
//! kernel with a [`Decision::Mangle`](super::Decision::Mangle) ([`fix_checksums`]).
//!
//! [`locate`] handles every IPv4 and IPv6 layout the kernel can hand to NFQUEUE: IPv4 options
//! (IHL), IPv4 fragments, IPv6 extension headers (hop-by-hop, routing, destination options,
//! fragment, AH) in any order, and packets whose ports cannot be seen at all. Ports are visible
//! only in the first fragment (offset 0) of a packet whose headers all fall inside the copied
//! bytes; anything else is [`Ports::Unseen`] with the reason (`zcio nfq` decides those by
//! `--unseen`).
//!
//! Why [`fix_checksums`] exists: `nfqnl_mangle` copies the new bytes over the packet and marks
//! it `CHECKSUM_NONE`, so from then on the checksums in the bytes are the truth. A packet the
//! sending host has not finished (`CHECKSUM_PARTIAL`: locally generated, the NIC or the
//! segmentation was to complete it; `NFQA_SKB_CSUMNOTREADY` in [`Packet::skb_info`](super::Packet))
//! carries only the pseudo-header sum in its transport checksum field, and any rewrite of a
//! finished one invalidates it: either way the receiver drops the packet unless the sum is
//! recomputed over the new bytes, as libnetfilter_queue's `nfq_*_compute_checksum_*` helpers
//! make their users do by hand.

/// The transport header as far as it can be seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// Source and destination port (TCP, UDP, UDP-Lite, SCTP, DCCP).
    Seen {
        /// Source port.
        src: u16,
        /// Destination port.
        dst: u16,
    },
    /// The protocol has no ports (ICMP, GRE, ...).
    None,
    /// The protocol may have ports but they are not in the copied bytes.
    Unseen(Unseen),
}

/// Why a packet's ports are not visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unseen {
    /// A fragment other than the first: the transport header is in the first one.
    LaterFragment,
    /// The copy range (or the packet) ends inside the headers.
    Truncated,
    /// ESP: everything after the SPI is encrypted (the upper protocol is unknown too).
    Encrypted,
}

/// What the filter knows about a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L4 {
    /// IP version (4 or 6).
    pub version: u8,
    /// Upper-layer protocol after every extension header (50 for ESP).
    pub proto: u8,
    /// Offset of the transport header from the start of the network header.
    pub offset: usize,
    /// Fragment offset in 8-byte units, when the packet is a fragment.
    pub frag: Option<u16>,
    /// The ports.
    pub ports: Ports,
    /// IPv6: a routing header with segments left was walked, so the destination address in
    /// the fixed header is not the final one (the transport checksum covers the final one).
    pub routed: bool,
}

fn has_ports(proto: u8) -> bool {
    // TCP, UDP, DCCP, SCTP, UDP-Lite: source and destination port are the first 4 bytes.
    matches!(proto, 6 | 17 | 33 | 132 | 136)
}

fn ports_at(p: &[u8], proto: u8, off: usize, frag: Option<u16>) -> Ports {
    if !has_ports(proto) {
        return Ports::None;
    }
    if frag.is_some_and(|f| f != 0) {
        return Ports::Unseen(Unseen::LaterFragment);
    }
    match p.get(off..off + 4) {
        Some(b) => Ports::Seen {
            src: u16::from_be_bytes([b[0], b[1]]),
            dst: u16::from_be_bytes([b[2], b[3]]),
        },
        None => Ports::Unseen(Unseen::Truncated),
    }
}

/// Locates the transport header of an IPv4 or IPv6 packet (from its network header on).
/// `None` when it is neither or its fixed header is cut.
pub fn locate(p: &[u8]) -> Option<L4> {
    match p.first()? >> 4 {
        4 => {
            if p.len() < 20 {
                return None;
            }
            let ihl = usize::from(p[0] & 0xf) * 4;
            if ihl < 20 {
                return None;
            }
            let frag_field = u16::from_be_bytes([p[6], p[7]]);
            let more = frag_field & 0x2000 != 0;
            let off = frag_field & 0x1fff;
            let frag = (more || off != 0).then_some(off);
            let mut proto = p[9];
            let mut at = ihl;
            if proto == 51 && frag.is_none_or_zero() {
                // AH: (payload length + 2) × 4 bytes, then the protected protocol.
                match p.get(at..at + 2) {
                    Some(h) => {
                        proto = h[0];
                        at += (usize::from(h[1]) + 2) * 4;
                    }
                    None => {
                        return Some(L4 {
                            version: 4,
                            proto,
                            offset: at,
                            frag,
                            ports: Ports::Unseen(Unseen::Truncated),
                            routed: false,
                        })
                    }
                }
            }
            let ports = if proto == 50 {
                Ports::Unseen(Unseen::Encrypted)
            } else if ihl > p.len() {
                if has_ports(proto) {
                    Ports::Unseen(Unseen::Truncated)
                } else {
                    Ports::None
                }
            } else {
                ports_at(p, proto, at, frag)
            };
            Some(L4 {
                version: 4,
                proto,
                offset: at,
                frag,
                ports,
                routed: false,
            })
        }
        6 => {
            if p.len() < 40 {
                return None;
            }
            let mut next = p[6];
            let mut at = 40;
            let mut frag = None;
            let mut routed = false;
            let cut = |proto: u8, at: usize, frag: Option<u16>, routed: bool| L4 {
                version: 6,
                proto,
                offset: at,
                frag,
                ports: Ports::Unseen(Unseen::Truncated),
                routed,
            };
            loop {
                match next {
                    // Hop-by-hop, routing, destination options: (len + 1) × 8 bytes.
                    0 | 43 | 60 => {
                        let Some(h) = p.get(at..at + 2) else {
                            return Some(cut(next, at, frag, routed));
                        };
                        if next == 43 {
                            // Segments left (byte 3): the final destination is further on.
                            match p.get(at + 3) {
                                Some(&left) => routed |= left != 0,
                                None => return Some(cut(next, at, frag, routed)),
                            }
                        }
                        next = h[0];
                        at += (usize::from(h[1]) + 1) * 8;
                    }
                    // Fragment: 8 bytes; offset in the upper 13 bits of bytes 2..4.
                    44 => {
                        let Some(h) = p.get(at..at + 8) else {
                            return Some(cut(next, at, frag, routed));
                        };
                        next = h[0];
                        frag = Some(u16::from_be_bytes([h[2], h[3]]) >> 3);
                        at += 8;
                        if frag != Some(0) {
                            // Headers after a later fragment's fragment header are payload.
                            return Some(L4 {
                                version: 6,
                                proto: next,
                                offset: at,
                                frag,
                                ports: ports_at(p, next, at, frag),
                                routed,
                            });
                        }
                    }
                    // AH: (len + 2) × 4 bytes.
                    51 => {
                        let Some(h) = p.get(at..at + 2) else {
                            return Some(cut(next, at, frag, routed));
                        };
                        next = h[0];
                        at += (usize::from(h[1]) + 2) * 4;
                    }
                    50 => {
                        return Some(L4 {
                            version: 6,
                            proto: 50,
                            offset: at,
                            frag,
                            ports: Ports::Unseen(Unseen::Encrypted),
                            routed,
                        })
                    }
                    proto => {
                        return Some(L4 {
                            version: 6,
                            proto,
                            offset: at,
                            frag,
                            ports: ports_at(p, proto, at, frag),
                            routed,
                        })
                    }
                }
            }
        }
        _ => None,
    }
}

/// Why [`fix_checksums`] left a packet as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    /// Not IPv4 or IPv6, or its fixed header is cut.
    #[error("not an IPv4 or IPv6 packet with a whole fixed header")]
    NotIp,
    /// The buffer ends inside the headers: the copy range cut the packet (`Packet::cap_len`),
    /// and a sum over part of the payload would be wrong.
    #[error("the packet ends inside its headers (cut by the copy range?)")]
    Truncated,
    /// A fragment: the transport checksum covers the reassembled datagram, not one fragment.
    #[error("an IP fragment: its transport checksum covers the whole datagram")]
    Fragment,
    /// ESP: the transport header is encrypted.
    #[error("ESP: the transport header is encrypted")]
    Encrypted,
    /// An IPv6 routing header with segments left: the checksum covers the final destination,
    /// which the packet's destination address is not yet.
    #[error("IPv6 routing header with segments left: the final destination is not known here")]
    Routed,
    /// Longer than the IP length field can say (65 535 bytes; IPv6 jumbograms are not handled).
    #[error("{0} bytes do not fit the IP length field")]
    TooLong(usize),
}

/// What [`fix_checksums`] rewrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    /// IP version (4 or 6).
    pub version: u8,
    /// Upper-layer protocol.
    pub proto: u8,
    /// Whether a transport checksum was recomputed (TCP, UDP, UDP-Lite, ICMP, ICMPv6); other
    /// protocols keep their bytes, only the IP header was made consistent.
    pub transport: bool,
}

/// Makes a rewritten packet consistent with its new bytes, in place: the IP length fields
/// (IPv4 total length, IPv6 payload length, the UDP length) are set to the buffer's length, the
/// IPv4 header checksum and the transport checksum (TCP, UDP, UDP-Lite over its coverage,
/// ICMP, ICMPv6, with the pseudo-header) are recomputed over the whole packet. Call it on the
/// buffer of a [`Decision::Mangle`](super::Decision::Mangle) after rewriting.
///
/// For a GSO packet (`NFQA_SKB_GSO`, a queue bound with `gso`) the sum covers the whole burst,
/// which is what local delivery checks and what TCP segmentation replaces with per-segment sums.
/// Refused, with the packet untouched: fragments, ESP, a cut packet (copy range smaller than
/// the packet), an IPv6 routing header with segments left, more than 65 535 bytes.
pub fn fix_checksums(p: &mut [u8]) -> Result<Fixed, ChecksumError> {
    let l4 = locate(p).ok_or(ChecksumError::NotIp)?;
    if l4.frag.is_some() {
        return Err(ChecksumError::Fragment);
    }
    if l4.proto == 50 {
        return Err(ChecksumError::Encrypted);
    }
    if l4.routed {
        return Err(ChecksumError::Routed);
    }
    let len = p.len();
    let hdr_end = if l4.version == 4 {
        usize::from(p[0] & 0xf) * 4
    } else {
        40
    };
    if hdr_end > len || l4.offset > len {
        return Err(ChecksumError::Truncated);
    }
    let l4_len = len - l4.offset;
    let (ck_at, min) = match l4.proto {
        6 => (Some(16), 20),
        17 | 136 => (Some(6), 8),
        1 | 58 => (Some(2), 4),
        _ => (None, 0),
    };
    if l4_len < min {
        return Err(ChecksumError::Truncated);
    }
    if l4.proto == 6 && l4_len < usize::from(p[l4.offset + 12] >> 4) * 4 {
        return Err(ChecksumError::Truncated);
    }
    if l4.version == 4 {
        let total = u16::try_from(len).map_err(|_| ChecksumError::TooLong(len))?;
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p[10..12].copy_from_slice(&[0, 0]);
        let c = !fold(sum(&p[..hdr_end], 0));
        p[10..12].copy_from_slice(&c.to_be_bytes());
    } else {
        let payload = u16::try_from(len - 40).map_err(|_| ChecksumError::TooLong(len))?;
        p[4..6].copy_from_slice(&payload.to_be_bytes());
    }
    let Some(ck_at) = ck_at else {
        return Ok(Fixed {
            version: l4.version,
            proto: l4.proto,
            transport: false,
        });
    };
    let t = l4.offset;
    // UDP-Lite's length field is its checksum coverage (0: the whole datagram), not the length.
    let covered = if l4.proto == 136 {
        match usize::from(u16::from_be_bytes([p[t + 4], p[t + 5]])) {
            0 => l4_len,
            c if (8..=l4_len).contains(&c) => c,
            _ => return Err(ChecksumError::Truncated),
        }
    } else {
        l4_len
    };
    if l4.proto == 17 {
        let ulen = u16::try_from(l4_len).map_err(|_| ChecksumError::TooLong(len))?;
        p[t + 4..t + 6].copy_from_slice(&ulen.to_be_bytes());
    }
    p[t + ck_at..t + ck_at + 2].copy_from_slice(&[0, 0]);
    // The pseudo-header (none for ICMPv4): addresses, upper-layer length, protocol.
    let mut acc = 0u32;
    if l4.version == 4 && l4.proto != 1 {
        acc = sum(&p[12..20], acc);
        acc += u32::from(l4.proto) + l4_len as u32;
    } else if l4.version == 6 {
        acc = sum(&p[8..40], acc);
        acc += u32::from(l4.proto) + (l4_len as u32 >> 16) + (l4_len as u32 & 0xffff);
    }
    let mut c = !fold(sum(&p[t..t + covered], acc));
    if c == 0 && matches!(l4.proto, 17 | 136) {
        // 0 means "no checksum" for UDP: a computed 0 is sent as all ones.
        c = 0xffff;
    }
    p[t + ck_at..t + ck_at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(Fixed {
        version: l4.version,
        proto: l4.proto,
        transport: true,
    })
}

/// Whether the packet's transport checksum is correct for its bytes (the check a receiver
/// makes; a UDP/IPv4 checksum of 0 means none and is accepted). `None` for what
/// [`fix_checksums`] refuses or does not sum.
pub fn checksums_ok(p: &[u8]) -> Option<bool> {
    let mut copy = p.to_vec();
    let l4 = locate(p)?;
    let at = match l4.proto {
        6 => 16,
        17 | 136 => 6,
        1 | 58 => 2,
        _ => return None,
    };
    let old = p.get(l4.offset + at..l4.offset + at + 2)?;
    if l4.version == 4 && l4.proto == 17 && old == [0, 0] {
        return Some(true);
    }
    fix_checksums(&mut copy).ok()?;
    Some(copy == p)
}

/// One's-complement sum of `b` as big-endian 16-bit words (an odd last byte padded with 0),
/// added to `acc`; 64-bit accumulation folded at the end.
fn sum(b: &[u8], acc: u32) -> u32 {
    let mut s = u64::from(acc);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // Two 32-bit halves: the carries stay inside 64 bits for any realistic length.
        s += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut rest = chunks.remainder().chunks_exact(2);
    for c in &mut rest {
        s += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = rest.remainder() {
        s += u64::from(*last) << 8;
    }
    while s > 0xffff_ffff {
        s = (s & 0xffff_ffff) + (s >> 32);
    }
    s as u32
}

/// Folds a 32-bit one's-complement sum to 16 bits.
fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

trait ZeroOrNone {
    fn is_none_or_zero(&self) -> bool;
}
impl ZeroOrNone for Option<u16> {
    fn is_none_or_zero(&self) -> bool {
        self.map_or(true, |f| f == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet layout: what the tests emit and expect `locate` to find.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Layout {
        v6: bool,
        /// IPv4: option bytes (a multiple of 4). IPv6: extension headers `(type, bytes)`.
        v4_options: usize,
        ext: Vec<(u8, usize)>,
        /// Fragment offset (IPv4 header field, or an IPv6 fragment header in `ext`).
        frag: Option<(u16, bool)>,
        proto: u8,
        ports: Option<(u16, u16)>,
    }

    /// Emits the headers of `l` (and 8 bytes of transport header).
    fn emit(l: &Layout) -> Vec<u8> {
        let mut p = Vec::new();
        let mut upper = l.proto;
        if !l.v6 {
            let ihl = 20 + l.v4_options;
            p.resize(ihl, 0);
            p[0] = 0x40 | (ihl / 4) as u8;
            if let Some((off, more)) = l.frag {
                let f = off | if more { 0x2000 } else { 0 };
                p[6..8].copy_from_slice(&f.to_be_bytes());
            }
            // AH is the only IPv4 "extension" modelled.
            if let Some(&(51, len)) = l.ext.first() {
                p[9] = 51;
                let mut h = vec![0u8; len];
                h[0] = upper;
                h[1] = (len / 4 - 2) as u8;
                p.extend_from_slice(&h);
                upper = 51;
            } else {
                p[9] = upper;
            }
            for (i, b) in p.iter_mut().enumerate().take(ihl).skip(20) {
                *b = if i == ihl - 1 { 0 } else { 1 }; // NOPs, then EOL
            }
            let _ = upper;
        } else {
            p.resize(40, 0);
            p[0] = 0x60;
            let first = l.ext.first().map_or(l.proto, |e| e.0);
            p[6] = first;
            for (i, &(ty, len)) in l.ext.iter().enumerate() {
                let nh = l.ext.get(i + 1).map_or(l.proto, |e| e.0);
                let mut h = vec![0u8; len];
                h[0] = nh;
                match ty {
                    44 => {
                        let (off, more) = l.frag.unwrap_or((0, false));
                        let f = (off << 3) | u16::from(more);
                        h[2..4].copy_from_slice(&f.to_be_bytes());
                    }
                    51 => h[1] = (len / 4 - 2) as u8,
                    _ => h[1] = (len / 8 - 1) as u8,
                }
                p.extend_from_slice(&h);
            }
        }
        let mut t = [0u8; 8];
        if let Some((s, d)) = l.ports {
            t[0..2].copy_from_slice(&s.to_be_bytes());
            t[2..4].copy_from_slice(&d.to_be_bytes());
        }
        p.extend_from_slice(&t);
        p
    }

    /// Parses bytes back into the layout (using `locate` for the transport header).
    fn parse(p: &[u8]) -> Layout {
        let l4 = locate(p).expect("an IP packet");
        let v6 = l4.version == 6;
        let mut ext = Vec::new();
        let mut v4_options = 0;
        let mut frag = None;
        if v6 {
            let mut next = p[6];
            let mut at = 40;
            while at < l4.offset {
                let len = match next {
                    44 => 8,
                    51 => (usize::from(p[at + 1]) + 2) * 4,
                    _ => (usize::from(p[at + 1]) + 1) * 8,
                };
                if next == 44 {
                    let f = u16::from_be_bytes([p[at + 2], p[at + 3]]);
                    frag = Some((f >> 3, f & 1 != 0));
                }
                ext.push((next, len));
                next = p[at];
                at += len;
            }
        } else {
            let ihl = usize::from(p[0] & 0xf) * 4;
            v4_options = ihl - 20;
            let f = u16::from_be_bytes([p[6], p[7]]);
            if f & 0x3fff != 0 {
                frag = Some((f & 0x1fff, f & 0x2000 != 0));
            }
            if l4.offset > ihl {
                ext.push((51, l4.offset - ihl));
            }
        }
        let ports = match l4.ports {
            Ports::Seen { src, dst } => Some((src, dst)),
            _ => None,
        };
        Layout {
            v6,
            v4_options,
            ext,
            frag,
            proto: l4.proto,
            ports,
        }
    }

    fn v4(opts: usize, frag: Option<(u16, bool)>, proto: u8, ports: Option<(u16, u16)>) -> Layout {
        Layout {
            v6: false,
            v4_options: opts,
            ext: vec![],
            frag,
            proto,
            ports,
        }
    }

    fn v6(
        ext: &[(u8, usize)],
        frag: Option<(u16, bool)>,
        proto: u8,
        ports: Option<(u16, u16)>,
    ) -> Layout {
        Layout {
            v6: true,
            v4_options: 0,
            ext: ext.to_vec(),
            frag,
            proto,
            ports,
        }
    }

    /// parse → emit → compare on bytes, and the layout found is the layout emitted.
    fn round_trip(l: Layout) -> L4 {
        let bytes = emit(&l);
        let back = parse(&bytes);
        assert_eq!(back, l, "layout found differs");
        assert_eq!(emit(&back), bytes, "re-emitted bytes differ");
        locate(&bytes).unwrap()
    }

    #[test]
    fn ipv4_without_and_with_options_finds_the_ports() {
        for opts in [0, 4, 12, 40] {
            let l4 = round_trip(v4(opts, None, 17, Some((1000, 53))));
            assert_eq!(l4.offset, 20 + opts);
            assert_eq!(l4.ports, Ports::Seen { src: 1000, dst: 53 });
        }
        let l4 = round_trip(v4(8, None, 6, Some((40000, 443))));
        assert_eq!(
            l4.ports,
            Ports::Seen {
                src: 40000,
                dst: 443
            }
        );
    }

    #[test]
    fn ipv4_first_fragment_has_ports_later_ones_do_not() {
        let l4 = round_trip(v4(0, Some((0, true)), 17, Some((1, 53))));
        assert_eq!(l4.ports, Ports::Seen { src: 1, dst: 53 });
        let l4 = round_trip(v4(4, Some((185, false)), 17, None));
        assert_eq!(l4.ports, Ports::Unseen(Unseen::LaterFragment));
        assert_eq!(l4.frag, Some(185));
    }

    #[test]
    fn ipv4_ah_is_skipped() {
        let mut l = v4(0, None, 17, Some((7, 53)));
        l.ext = vec![(51, 24)];
        let l4 = round_trip(l);
        assert_eq!(l4.offset, 44);
        assert_eq!(l4.ports, Ports::Seen { src: 7, dst: 53 });
    }

    #[test]
    fn ipv6_extension_headers_in_any_order_are_walked() {
        let chains: &[&[(u8, usize)]] = &[
            &[],
            &[(0, 8)],
            &[(0, 16), (60, 8), (43, 24)],
            &[(0, 8), (43, 24), (44, 8), (51, 16), (60, 8)],
            &[(60, 40), (51, 24)],
        ];
        for chain in chains {
            let frag = chain.iter().any(|e| e.0 == 44).then_some((0, true));
            let l4 = round_trip(v6(chain, frag, 6, Some((5555, 22))));
            let hdrs: usize = chain.iter().map(|e| e.1).sum();
            assert_eq!(l4.offset, 40 + hdrs, "{chain:?}");
            assert_eq!(l4.ports, Ports::Seen { src: 5555, dst: 22 }, "{chain:?}");
        }
    }

    #[test]
    fn ipv6_later_fragment_has_no_ports_but_a_protocol() {
        let l4 = round_trip(v6(&[(0, 8), (44, 8)], Some((100, false)), 17, None));
        assert_eq!(l4.proto, 17);
        assert_eq!(l4.ports, Ports::Unseen(Unseen::LaterFragment));
    }

    #[test]
    fn esp_and_cut_headers_say_why_ports_are_unseen() {
        let bytes = emit(&v6(&[(0, 8)], None, 50, None));
        assert_eq!(
            locate(&bytes).unwrap().ports,
            Ports::Unseen(Unseen::Encrypted)
        );
        let bytes = emit(&v4(0, None, 50, None));
        assert_eq!(
            locate(&bytes).unwrap().ports,
            Ports::Unseen(Unseen::Encrypted)
        );
        // A copy range that ends inside the extension headers or before the ports.
        let bytes = emit(&v6(&[(0, 8), (60, 64)], None, 17, Some((1, 2))));
        for cut in [41, 48, 60, 112, 113] {
            let l4 = locate(&bytes[..cut]).unwrap();
            assert_eq!(l4.ports, Ports::Unseen(Unseen::Truncated), "cut at {cut}");
        }
        let bytes = emit(&v4(20, None, 17, Some((1, 2))));
        assert_eq!(
            locate(&bytes[..42]).unwrap().ports,
            Ports::Unseen(Unseen::Truncated)
        );
        // ICMP has no ports to see.
        assert_eq!(
            locate(&emit(&v4(0, None, 1, None))).unwrap().ports,
            Ports::None
        );
        assert_eq!(
            locate(&emit(&v6(&[(0, 8)], None, 58, None))).unwrap().ports,
            Ports::None
        );
        // Not IP, or a cut fixed header.
        assert_eq!(locate(&[0x50; 40]), None);
        assert_eq!(locate(&bytes[..19]), None);
        assert_eq!(locate(&[0x41; 20]), None, "IHL below 5");
    }
    /// The receiver's check, written independently of [`sum`]: 16-bit words one at a time
    /// over the pseudo-header and the segment must add up to all ones.
    fn receiver_accepts(p: &[u8]) -> bool {
        let l4 = locate(p).unwrap();
        let seg = &p[l4.offset..];
        let mut words: Vec<u32> = Vec::new();
        fn push(words: &mut Vec<u32>, b: &[u8]) {
            for c in b.chunks(2) {
                words.push(u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)));
            }
        }
        let covered = if l4.proto == 136 {
            match usize::from(u16::from_be_bytes([seg[4], seg[5]])) {
                0 => seg.len(),
                c => c,
            }
        } else {
            seg.len()
        };
        if l4.version == 4 && l4.proto != 1 {
            push(&mut words, &p[12..20]);
            words.push(u32::from(l4.proto));
            words.push(seg.len() as u32);
        } else if l4.version == 6 {
            push(&mut words, &p[8..40]);
            let n = seg.len() as u32;
            words.extend([n >> 16, n & 0xffff, u32::from(l4.proto)]);
        }
        push(&mut words, &seg[..covered]);
        let mut s: u32 = words.iter().sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s == 0xffff
    }

    fn packet(v6: bool, proto: u8, payload: &[u8], ext: &[(u8, usize)]) -> Vec<u8> {
        let hdr = match proto {
            6 => 20,
            17 | 136 => 8,
            _ => 4,
        };
        let mut l = if v6 {
            v6_layout(ext, proto)
        } else {
            v4(0, None, proto, None)
        };
        l.ports = None;
        let mut p = emit(&l);
        let at = locate(&p).unwrap().offset;
        p.truncate(at);
        let mut t = vec![0u8; hdr];
        if proto == 6 {
            t[12] = 5 << 4;
        }
        t[0] = 0x12;
        t[3] = 0x34;
        p.extend_from_slice(&t);
        p.extend_from_slice(payload);
        if !v6 {
            // Addresses 10.1.2.3 -> 192.0.2.7.
            p[12..20].copy_from_slice(&[10, 1, 2, 3, 192, 0, 2, 7]);
        } else {
            for (i, b) in p[8..40].iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(37) ^ 0x20;
            }
        }
        p
    }

    fn v6_layout(ext: &[(u8, usize)], proto: u8) -> Layout {
        v6(ext, None, proto, None)
    }

    #[test]
    fn ipv4_header_checksum_matches_a_known_header() {
        // A widely published example header: checksum 0xb861 for this header, total length 115.
        let mut p = vec![0u8; 115];
        p[..20].copy_from_slice(&[
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ]);
        let f = fix_checksums(&mut p).unwrap();
        assert_eq!((f.version, f.proto, f.transport), (4, 17, true));
        assert_eq!(&p[10..12], &[0xb8, 0x61]);
        assert_eq!(&p[24..26], &95u16.to_be_bytes(), "UDP length set");
        assert!(receiver_accepts(&p));
    }

    #[test]
    fn fixed_packets_pass_the_receivers_check_for_every_protocol_and_layout() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let exts: &[&[(u8, usize)]] = &[&[], &[(0, 8)], &[(0, 16), (60, 8), (43, 24)]];
        for v6 in [false, true] {
            for proto in [6u8, 17, 136, 1, 58] {
                if (proto == 1 && v6) || (proto == 58 && !v6) {
                    continue;
                }
                for len in [
                    0usize, 1, 2, 3, 7, 8, 9, 63, 64, 65, 1399, 1400, 8191, 65000,
                ] {
                    for ext in exts {
                        if !v6 && !ext.is_empty() {
                            continue;
                        }
                        let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                        let mut p = packet(v6, proto, &payload, ext);
                        let Ok(f) = fix_checksums(&mut p) else {
                            // Only an IPv4 packet over 65 535 bytes may be refused here.
                            assert!(p.len() > 65535, "{v6} {proto} {len}");
                            continue;
                        };
                        assert!(f.transport);
                        assert!(
                            receiver_accepts(&p),
                            "v6 {v6} proto {proto} len {len} {ext:?}"
                        );
                        assert_eq!(checksums_ok(&p), Some(true));
                        if len > 0 {
                            // Any change to the payload is caught.
                            let at = p.len() - 1 - (next() as usize % len);
                            p[at] ^= 1 + (next() as u8 % 255);
                            assert_eq!(checksums_ok(&p), Some(false), "{v6} {proto} {len}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn udp_lite_sums_only_its_coverage_and_a_zero_udp_sum_is_sent_as_ones() {
        let mut p = packet(false, 136, &[0xab; 100], &[]);
        p[24..26].copy_from_slice(&16u16.to_be_bytes()); // coverage: header + 8 bytes
        fix_checksums(&mut p).unwrap();
        assert!(receiver_accepts(&p));
        let before = p.clone();
        *p.last_mut().unwrap() ^= 0xff; // outside the coverage
        fix_checksums(&mut p).unwrap();
        assert_eq!(
            p[26..28],
            before[26..28],
            "uncovered bytes do not change the sum"
        );
        // Search for a payload whose UDP sum computes to 0: it must go out as 0xffff.
        let mut found = false;
        for x in 0..=0xffffu32 {
            let mut p = packet(false, 17, &(x as u16).to_be_bytes(), &[]);
            fix_checksums(&mut p).unwrap();
            if p[26..28] == [0xff, 0xff] {
                assert!(receiver_accepts(&p));
                found = true;
                break;
            }
        }
        assert!(found);
    }

    #[test]
    fn what_cannot_be_summed_is_refused_and_left_untouched() {
        let cases: Vec<(Vec<u8>, ChecksumError)> = vec![
            (vec![0x50; 40], ChecksumError::NotIp),
            (
                emit(&v4(0, Some((0, true)), 17, Some((1, 2)))),
                ChecksumError::Fragment,
            ),
            (
                emit(&v4(0, Some((100, false)), 17, None)),
                ChecksumError::Fragment,
            ),
            (
                emit(&v6(&[(44, 8)], Some((0, true)), 6, Some((1, 2)))),
                ChecksumError::Fragment,
            ),
            (emit(&v4(0, None, 50, None)), ChecksumError::Encrypted),
            (
                packet(false, 6, &[], &[])[..30].to_vec(),
                ChecksumError::Truncated,
            ),
            (vec![0u8; 70000], ChecksumError::NotIp),
        ];
        for (mut p, want) in cases {
            let before = p.clone();
            assert_eq!(fix_checksums(&mut p), Err(want));
            assert_eq!(p, before, "{want}");
        }
        // A routing header with segments left: the final destination is elsewhere.
        let mut p = packet(true, 17, &[1, 2, 3], &[(43, 24)]);
        p[43] = 1;
        assert!(locate(&p).unwrap().routed);
        assert_eq!(fix_checksums(&mut p), Err(ChecksumError::Routed));
        p[43] = 0;
        assert!(fix_checksums(&mut p).is_ok());
        // Over the IPv4 length field.
        let mut p = packet(false, 17, &vec![0; 70000], &[]);
        assert_eq!(fix_checksums(&mut p), Err(ChecksumError::TooLong(p.len())));
    }
}
