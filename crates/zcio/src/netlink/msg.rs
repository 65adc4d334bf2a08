//! Netlink message framing and attributes: a borrowing parser that never panics on any input
//! and an emitter into a caller's `Vec<u8>`.
//!
//! zcio carries its own ~200-line parser rather than `netlink-packet-core`: the hot path parses
//! packets in place inside ring frames and emits dozens of verdicts back to back into one send
//! buffer without allocating, and the nfqueue messages are not in the rust-netlink family.

use crate::sys::netlink::{NLA_F_NESTED, NLA_F_NET_BYTEORDER, NLA_HDRLEN, NLA_TYPE_MASK};
pub use crate::sys::netlink::{NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, NLMSG_NOOP, NLMSG_OVERRUN};

/// Why bytes are not a well-formed netlink message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer bytes than a header needs.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A length field is smaller than its header or larger than the enclosing buffer.
    #[error("bad {what} length {len} (available {avail})")]
    BadLength {
        /// What was being read.
        what: &'static str,
        /// The length field.
        len: usize,
        /// Bytes available.
        avail: usize,
    },
    /// A required attribute is missing.
    #[error("missing attribute {0}")]
    Missing(&'static str),
    /// An attribute has the wrong size for its type.
    #[error("attribute {what} has {len} bytes, expected {expected}")]
    AttrSize {
        /// Attribute name.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The expected length.
        expected: usize,
    },
    /// A message of an unexpected type.
    #[error("unexpected message type {0}")]
    Type(u16),
}

/// Rounds up to the netlink alignment (4).
pub const fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One netlink message, borrowed from a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NlMsg<'a> {
    /// `nlmsg_type`.
    pub ty: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// `nlmsg_pid`.
    pub pid: u32,
    /// Bytes after the header, `nlmsg_len - 16` of them.
    pub payload: &'a [u8],
}

fn u16_ne(b: &[u8]) -> u16 {
    u16::from_ne_bytes([b[0], b[1]])
}
fn u32_ne(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

impl<'a> NlMsg<'a> {
    /// Parses one message at the start of `buf`; returns it and the aligned length consumed.
    pub fn parse(buf: &'a [u8]) -> Result<(Self, usize), ParseError> {
        if buf.len() < NLMSG_HDRLEN {
            return Err(ParseError::Truncated {
                what: "nlmsghdr",
                need: NLMSG_HDRLEN,
                have: buf.len(),
            });
        }
        let len = u32_ne(&buf[0..4]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(ParseError::BadLength {
                what: "nlmsg",
                len,
                avail: buf.len(),
            });
        }
        let m = NlMsg {
            ty: u16_ne(&buf[4..6]),
            flags: u16_ne(&buf[6..8]),
            seq: u32_ne(&buf[8..12]),
            pid: u32_ne(&buf[12..16]),
            payload: &buf[NLMSG_HDRLEN..len],
        };
        Ok((m, align(len).min(buf.len())))
    }

    /// Appends this message (header + payload, padded) to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), EmitError> {
        emit_whole(out, |out| {
            emit_header(out, self.ty, self.flags, self.seq, self.pid);
            out.extend_from_slice(self.payload);
            Ok(())
        })
    }

    /// For an `NLMSG_ERROR` message: the errno (0 for an ACK, negative for an error).
    pub fn error_code(&self) -> Result<i32, ParseError> {
        if self.payload.len() < 4 {
            return Err(ParseError::Truncated {
                what: "nlmsgerr",
                need: 4,
                have: self.payload.len(),
            });
        }
        Ok(u32_ne(&self.payload[0..4]) as i32)
    }
}

/// Iterates the messages of one datagram. After the first error it yields nothing more.
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    buf: &'a [u8],
    failed: bool,
}

/// The messages in `buf`.
pub fn messages(buf: &[u8]) -> Messages<'_> {
    Messages { buf, failed: false }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<NlMsg<'a>, ParseError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() || self.failed {
            return None;
        }
        match NlMsg::parse(self.buf) {
            Ok((m, used)) => {
                self.buf = &self.buf[used..];
                Some(Ok(m))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// One attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr<'a> {
    /// Type without the NESTED / NET_BYTEORDER flags.
    pub ty: u16,
    /// The raw `nla_type` including flags (kept for exact re-emission).
    pub raw_ty: u16,
    /// Payload (`nla_len - 4` bytes).
    pub value: &'a [u8],
}

impl<'a> Attr<'a> {
    /// Whether `NLA_F_NESTED` is set.
    pub fn nested(&self) -> bool {
        self.raw_ty & NLA_F_NESTED != 0
    }
    /// Whether `NLA_F_NET_BYTEORDER` is set.
    pub fn net_byteorder(&self) -> bool {
        self.raw_ty & NLA_F_NET_BYTEORDER != 0
    }
    /// A big-endian u32 payload.
    pub fn be32(&self, what: &'static str) -> Result<u32, ParseError> {
        let b = self.exact(what, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A native-endian u32 payload.
    pub fn ne32(&self, what: &'static str) -> Result<u32, ParseError> {
        let b = self.exact(what, 4)?;
        Ok(u32_ne(b))
    }
    /// The payload, which must be exactly `n` bytes.
    pub fn exact(&self, what: &'static str, n: usize) -> Result<&'a [u8], ParseError> {
        if self.value.len() != n {
            return Err(ParseError::AttrSize {
                what,
                len: self.value.len(),
                expected: n,
            });
        }
        Ok(self.value)
    }
    /// The payload, which must be at least `n` bytes.
    pub fn at_least(&self, what: &'static str, n: usize) -> Result<&'a [u8], ParseError> {
        if self.value.len() < n {
            return Err(ParseError::AttrSize {
                what,
                len: self.value.len(),
                expected: n,
            });
        }
        Ok(self.value)
    }
}

/// Iterates attributes; after the first error it yields nothing more.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    buf: &'a [u8],
    failed: bool,
}

/// The attributes in `buf`.
pub fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs { buf, failed: false }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, ParseError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() || self.failed {
            return None;
        }
        let b = self.buf;
        if b.len() < NLA_HDRLEN {
            self.failed = true;
            return Some(Err(ParseError::Truncated {
                what: "nlattr",
                need: NLA_HDRLEN,
                have: b.len(),
            }));
        }
        let len = u16_ne(&b[0..2]) as usize;
        if len < NLA_HDRLEN || len > b.len() {
            self.failed = true;
            return Some(Err(ParseError::BadLength {
                what: "nlattr",
                len,
                avail: b.len(),
            }));
        }
        let raw_ty = u16_ne(&b[2..4]);
        let a = Attr {
            ty: raw_ty & NLA_TYPE_MASK,
            raw_ty,
            value: &b[NLA_HDRLEN..len],
        };
        self.buf = &b[align(len).min(b.len())..];
        Some(Ok(a))
    }
}

/// Largest attribute payload: `nla_len` is a u16 that counts the 4-byte header too.
pub const MAX_ATTR_PAYLOAD: usize = u16::MAX as usize - NLA_HDRLEN;

/// Largest message zcio emits: `nlmsg_len` is a u32, but no socket buffer holds more than a
/// few MiB; anything larger is a caller's mistake, refused instead of truncated.
pub const MAX_MSG_LEN: usize = 1 << 30;

/// Why a message could not be emitted. Nothing is appended when emitting fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// An attribute's payload does not fit `nla_len` (u16).
    #[error(
        "attribute type {ty} with {len} bytes exceeds the netlink attribute limit of {max} bytes"
    )]
    AttrTooLong {
        /// Attribute type (flags included).
        ty: u16,
        /// Payload bytes asked for.
        len: usize,
        /// Largest payload an attribute carries.
        max: usize,
    },
    /// A message exceeds [`MAX_MSG_LEN`].
    #[error("netlink message of {len} bytes exceeds {max} bytes")]
    MsgTooLong {
        /// Bytes of the message.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Appends a netlink header with a zero length (fixed by [`finish`]).
pub fn emit_header(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, pid: u32) {
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&pid.to_ne_bytes());
}

/// Writes the length of the message that starts at `start` and pads it to 4 bytes. A message
/// longer than [`MAX_MSG_LEN`] is removed from `out` again and refused.
pub fn finish(out: &mut Vec<u8>, start: usize) -> Result<(), EmitError> {
    let len = out.len() - start;
    if len > MAX_MSG_LEN {
        out.truncate(start);
        return Err(EmitError::MsgTooLong {
            len,
            max: MAX_MSG_LEN,
        });
    }
    out[start..start + 4].copy_from_slice(&(len as u32).to_ne_bytes());
    while out.len() % 4 != start % 4 {
        out.push(0);
    }
    Ok(())
}

/// Appends an attribute (raw type, flags included) with its payload, padded. A payload longer
/// than [`MAX_ATTR_PAYLOAD`] is refused (its length would wrap and the kernel would read the
/// rest of the payload as more attributes); nothing is appended then.
pub fn emit_attr(out: &mut Vec<u8>, raw_ty: u16, value: &[u8]) -> Result<(), EmitError> {
    if value.len() > MAX_ATTR_PAYLOAD {
        return Err(EmitError::AttrTooLong {
            ty: raw_ty,
            len: value.len(),
            max: MAX_ATTR_PAYLOAD,
        });
    }
    let len = (NLA_HDRLEN + value.len()) as u16;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&raw_ty.to_ne_bytes());
    out.extend_from_slice(value);
    for _ in value.len()..align(value.len()) {
        out.push(0);
    }
    Ok(())
}

/// Runs `body` to emit one message that starts at `out.len()`; when it fails, whatever it
/// appended is removed, so `out` keeps only whole messages.
pub fn emit_whole(
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), EmitError>,
) -> Result<(), EmitError> {
    let start = out.len();
    let r = body(out).and_then(|()| finish(out, start));
    if r.is_err() {
        out.truncate(start);
    }
    r
}

/// Re-emits a whole datagram from its parsed messages and attribute lists: the generic
/// round trip used by the tests (`payload_prefix` bytes of each message are a fixed header,
/// such as `nfgenmsg` (4) or `rtmsg` (12), the rest attributes).
pub fn reemit(buf: &[u8], payload_prefix: usize) -> Result<Vec<u8>, ParseError> {
    let mut out = Vec::with_capacity(buf.len());
    for m in messages(buf) {
        let m = m?;
        let start = out.len();
        emit_header(&mut out, m.ty, m.flags, m.seq, m.pid);
        if m.ty < 16 || m.payload.len() < payload_prefix {
            out.extend_from_slice(m.payload);
        } else {
            out.extend_from_slice(&m.payload[..payload_prefix]);
            for a in attrs(&m.payload[payload_prefix..]) {
                let a = a?;
                // A parsed attribute's length came from a u16: it always fits again.
                emit_attr(&mut out, a.raw_ty, a.value).expect("parsed attribute re-emits");
            }
        }
        // A parsed message's length came from a u32 and fitted the buffer.
        finish(&mut out, start).expect("parsed message re-emits");
    }
    Ok(out)
}
