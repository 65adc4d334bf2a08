//! Where the transport header of a queued packet is, for every IPv4 and IPv6 layout the
//! kernel can hand to NFQUEUE: IPv4 options (IHL), IPv4 fragments, IPv6 extension headers
//! (hop-by-hop, routing, destination options, fragment, AH) in any order, and packets whose
//! ports cannot be seen at all.
//!
//! Ports are visible only in the first fragment (offset 0) of a packet whose headers all fall
//! inside the copied bytes; anything else is [`Ports::Unseen`] with the reason, and the rules
//! decide those by `--unseen` (see [`super::Rules`]).

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
            })
        }
        6 => {
            if p.len() < 40 {
                return None;
            }
            let mut next = p[6];
            let mut at = 40;
            let mut frag = None;
            let cut = |proto: u8, at: usize, frag: Option<u16>| L4 {
                version: 6,
                proto,
                offset: at,
                frag,
                ports: Ports::Unseen(Unseen::Truncated),
            };
            loop {
                match next {
                    // Hop-by-hop, routing, destination options: (len + 1) × 8 bytes.
                    0 | 43 | 60 => {
                        let Some(h) = p.get(at..at + 2) else {
                            return Some(cut(next, at, frag));
                        };
                        next = h[0];
                        at += (usize::from(h[1]) + 1) * 8;
                    }
                    // Fragment: 8 bytes; offset in the upper 13 bits of bytes 2..4.
                    44 => {
                        let Some(h) = p.get(at..at + 8) else {
                            return Some(cut(next, at, frag));
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
                            });
                        }
                    }
                    // AH: (len + 2) × 4 bytes.
                    51 => {
                        let Some(h) = p.get(at..at + 2) else {
                            return Some(cut(next, at, frag));
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
                        })
                    }
                    proto => {
                        return Some(L4 {
                            version: 6,
                            proto,
                            offset: at,
                            frag,
                            ports: ports_at(p, proto, at, frag),
                        })
                    }
                }
            }
        }
        _ => None,
    }
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
}
