//! The memcached text protocol, client side, without I/O: requests written into a buffer, and
//! replies parsed from a byte stream that may stop at any byte, each checked against what its
//! request must get back ([`Session`]).
//!
//! Only what the load uses: `set` (must answer `STORED`) and one-key `get` (`VALUE … END` or a
//! bare `END` for a miss). Any other line, a server error, or bytes that cannot start a reply
//! are errors with the offending text; nothing is skipped.

use std::collections::VecDeque;
use std::fmt;
use std::io::Write;

/// Longest reply line accepted before its `\r\n` (memcached keys are at most 250 bytes).
pub const MAX_LINE: usize = 512;
/// Largest value accepted in a reply.
pub const MAX_VALUE: usize = 1 << 20;

/// What a request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `get <key>`.
    Get,
    /// `set <key> <flags> 0 <bytes>`.
    Set,
}

/// One complete reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `STORED`.
    Stored,
    /// `END` alone: the key is not there.
    Miss,
    /// `VALUE <key> <flags> <bytes>` + data + `END`.
    Hit {
        /// The key the server named.
        key: &'a [u8],
        /// Its flags.
        flags: u32,
        /// Its data.
        data: &'a [u8],
    },
}

/// A reply that is not what the request must get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// `ERROR`, `CLIENT_ERROR …` or `SERVER_ERROR …`.
    Server(String),
    /// A well-formed reply of the wrong kind (e.g. `NOT_STORED` to a set, `STORED` to a get).
    Unexpected {
        /// The request.
        want: Kind,
        /// The reply line.
        line: String,
    },
    /// Bytes that are no reply.
    Malformed(String),
    /// No `\r\n` within [`MAX_LINE`] bytes.
    LineTooLong,
    /// A well-formed hit whose key, flags or data differ from what was set.
    Mismatch(String),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server(l) => write!(f, "server error reply: {l}"),
            Self::Unexpected { want, line } => write!(f, "reply {line:?} to a {want:?}"),
            Self::Malformed(s) => write!(f, "malformed reply: {s}"),
            Self::LineTooLong => write!(f, "reply line longer than {MAX_LINE} bytes"),
            Self::Mismatch(s) => write!(f, "wrong value read back: {s}"),
        }
    }
}

impl std::error::Error for ProtoError {}

fn show(b: &[u8]) -> String {
    let b = &b[..b.len().min(80)];
    String::from_utf8_lossy(b).escape_debug().to_string()
}

/// Words a reply line can begin with; a prefix that begins none of them is garbage at once.
const STARTS: &[&[u8]] = &[
    b"STORED\r",
    b"END\r",
    b"VALUE ",
    b"ERROR\r",
    b"CLIENT_ERROR ",
    b"SERVER_ERROR ",
    b"NOT_STORED\r",
    b"EXISTS\r",
    b"NOT_FOUND\r",
];

fn could_start(b: &[u8]) -> bool {
    STARTS.iter().any(|w| {
        let n = w.len().min(b.len());
        w[..n] == b[..n]
    })
}

/// The first line of `b` without its `\r\n`, and the length with it; `None` while incomplete.
fn line(b: &[u8]) -> Result<Option<(&[u8], usize)>, ProtoError> {
    let Some(p) = b.iter().position(|&c| c == b'\n') else {
        if b.len() > MAX_LINE {
            return Err(ProtoError::LineTooLong);
        }
        if b.contains(&b'\r') && !b.ends_with(b"\r") {
            return Err(ProtoError::Malformed(format!("bare CR in {:?}", show(b))));
        }
        return Ok(None);
    };
    if p > MAX_LINE {
        return Err(ProtoError::LineTooLong);
    }
    if p == 0 || b[p - 1] != b'\r' || b[..p - 1].contains(&b'\r') {
        return Err(ProtoError::Malformed(format!(
            "line not ended by CRLF: {:?}",
            show(&b[..=p])
        )));
    }
    Ok(Some((&b[..p - 1], p + 1)))
}

fn number<T: std::str::FromStr>(w: Option<&[u8]>, what: &str) -> Result<T, ProtoError> {
    let w = w.ok_or_else(|| ProtoError::Malformed(format!("VALUE line without {what}")))?;
    if w.is_empty() || w.len() > 20 || !w.iter().all(u8::is_ascii_digit) {
        return Err(ProtoError::Malformed(format!("bad {what} {:?}", show(w))));
    }
    std::str::from_utf8(w)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ProtoError::Malformed(format!("{what} out of range: {:?}", show(w))))
}

/// Parses one reply to a `kind` request at the start of `b`: `Ok(None)` while more bytes are
/// needed, else the reply and the bytes it took.
pub fn parse(b: &[u8], kind: Kind) -> Result<Option<(usize, Reply<'_>)>, ProtoError> {
    if !could_start(b) {
        return Err(ProtoError::Malformed(format!("not a reply: {:?}", show(b))));
    }
    let Some((l, n)) = line(b)? else {
        return Ok(None);
    };
    if l == b"ERROR" || l.starts_with(b"CLIENT_ERROR ") || l.starts_with(b"SERVER_ERROR ") {
        return Err(ProtoError::Server(show(l)));
    }
    let unexpected = || ProtoError::Unexpected {
        want: kind,
        line: show(l),
    };
    match kind {
        Kind::Set if l == b"STORED" => Ok(Some((n, Reply::Stored))),
        Kind::Get if l == b"END" => Ok(Some((n, Reply::Miss))),
        Kind::Get if l.starts_with(b"VALUE ") => {
            let mut w = l[6..].split(|&c| c == b' ');
            let key = w.next().unwrap_or_default();
            if key.is_empty() || key.len() > 250 {
                return Err(ProtoError::Malformed(format!("bad key in {:?}", show(l))));
            }
            let flags: u32 = number(w.next(), "flags")?;
            let len: usize = number(w.next(), "length")?;
            if let Some(cas) = w.next() {
                number::<u64>(Some(cas), "cas")?;
            }
            if w.next().is_some() {
                return Err(ProtoError::Malformed(format!("extra words: {:?}", show(l))));
            }
            if len > MAX_VALUE {
                return Err(ProtoError::Malformed(format!("value of {len} bytes")));
            }
            let rest = &b[n..];
            // The data, its CRLF, then END\r\n (a one-key get has one VALUE).
            let end = b"END\r\n";
            let have = rest.len();
            if have > len && rest[len] != b'\r' || have > len + 1 && rest[len + 1] != b'\n' {
                return Err(ProtoError::Malformed(format!(
                    "{len} data bytes not followed by CRLF: {:?}",
                    show(&rest[len.min(have)..])
                )));
            }
            let tail = &rest[(len + 2).min(have)..];
            let k = tail.len().min(end.len());
            if tail[..k] != end[..k] {
                return Err(ProtoError::Malformed(format!(
                    "value not followed by END: {:?}",
                    show(tail)
                )));
            }
            if have < len + 2 + end.len() {
                return Ok(None);
            }
            Ok(Some((
                n + len + 2 + end.len(),
                Reply::Hit {
                    key,
                    flags,
                    data: &rest[..len],
                },
            )))
        }
        _ if l.starts_with(b"VALUE ")
            || [
                &b"STORED"[..],
                b"END",
                b"NOT_STORED",
                b"EXISTS",
                b"NOT_FOUND",
            ]
            .contains(&l) =>
        {
            Err(unexpected())
        }
        _ => Err(ProtoError::Malformed(format!(
            "unknown reply {:?}",
            show(l)
        ))),
    }
}

/// The key of index `k` on connection `conn`.
pub fn key(conn: u32, k: u32) -> String {
    format!("zc{conn}:k{k}")
}

/// The value a set of `version` writes for key `k`: `size` bytes that name the key and the
/// version (so a value read back from another key or an older set is told apart).
pub fn value(conn: u32, k: u32, version: u64, size: usize) -> Vec<u8> {
    let mut v = format!("{conn}.{k}.{version}:").into_bytes();
    let mut x = version.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(k);
    while v.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(b'a' + (x % 26) as u8);
    }
    v.truncate(size.max(1));
    v
}

/// A request in flight: what it was and what must come back.
#[derive(Debug)]
struct Pending<T> {
    kind: Kind,
    key: u32,
    /// For a get: the version of the last set issued before it (0: never set).
    version: u64,
    stamp: T,
}

/// How a connection's load is made.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Keys per connection.
    pub keys: u32,
    /// Value size in bytes.
    pub value_size: usize,
    /// Share of gets, in percent.
    pub get_percent: u32,
}

/// One connection's request stream and its checker: requests on a connection are answered in
/// order, and its keys are its own, so every reply's expected content is known when the
/// request is written. `T` is the send time stamp handed back with the reply.
pub struct Session<T> {
    conn: u32,
    mix: Mix,
    /// Per key, the version of the last set issued (0: none).
    issued: Vec<u64>,
    next_version: u64,
    rng: u64,
    pending: VecDeque<Pending<T>>,
}

impl<T: Copy> Session<T> {
    /// A session for connection `conn`.
    pub fn new(conn: u32, mix: Mix) -> Self {
        Self {
            conn,
            mix,
            issued: vec![0; mix.keys.max(1) as usize],
            next_version: 1,
            rng: 0x2545_F491_4F6C_DD1D ^ (u64::from(conn) + 1).wrapping_mul(0x9E37_79B9),
            pending: VecDeque::new(),
        }
    }

    /// Requests written and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Writes a set of key `k` into `out`.
    pub fn set(&mut self, out: &mut Vec<u8>, k: u32, stamp: T) {
        let version = self.next_version;
        self.next_version += 1;
        let v = value(self.conn, k, version, self.mix.value_size);
        let _ = write!(out, "set {} {k} 0 {}\r\n", key(self.conn, k), v.len());
        out.extend_from_slice(&v);
        out.extend_from_slice(b"\r\n");
        self.issued[k as usize] = version;
        self.pending.push_back(Pending {
            kind: Kind::Set,
            key: k,
            version,
            stamp,
        });
    }

    /// Writes a get of key `k` into `out`.
    pub fn get(&mut self, out: &mut Vec<u8>, k: u32, stamp: T) {
        let _ = write!(out, "get {}\r\n", key(self.conn, k));
        self.pending.push_back(Pending {
            kind: Kind::Get,
            key: k,
            version: self.issued[k as usize],
            stamp,
        });
    }

    /// Writes the next request of the mix into `out`.
    pub fn next(&mut self, out: &mut Vec<u8>, stamp: T) {
        let r = self.rand();
        let k = ((r >> 8) % u64::from(self.mix.keys.max(1))) as u32;
        if (r % 100) < u64::from(self.mix.get_percent) {
            self.get(out, k, stamp);
        } else {
            self.set(out, k, stamp);
        }
    }

    /// Takes the oldest request's reply from the start of `b` when it is complete and right:
    /// the bytes taken and the request's stamp.
    pub fn take(&mut self, b: &[u8]) -> Result<Option<(usize, T)>, ProtoError> {
        let Some(p) = self.pending.front() else {
            if b.is_empty() {
                return Ok(None);
            }
            return Err(ProtoError::Malformed(format!(
                "reply with no request: {:?}",
                show(b)
            )));
        };
        let Some((n, reply)) = parse(b, p.kind)? else {
            return Ok(None);
        };
        let name = key(self.conn, p.key);
        match (p.kind, reply) {
            (Kind::Set, Reply::Stored) => {}
            (Kind::Get, Reply::Miss) if p.version == 0 => {}
            (Kind::Get, Reply::Miss) => {
                return Err(ProtoError::Mismatch(format!(
                    "{name}: miss, but version {} was stored",
                    p.version
                )))
            }
            (Kind::Get, Reply::Hit { key, flags, data }) => {
                let want = value(self.conn, p.key, p.version, self.mix.value_size);
                if p.version == 0
                    || key != name.as_bytes()
                    || flags != p.key
                    || data != want.as_slice()
                {
                    return Err(ProtoError::Mismatch(format!(
                        "get {name} (version {}, flags {}) returned key {:?} flags {flags} \
                         data {:?}",
                        p.version,
                        p.key,
                        show(key),
                        show(data)
                    )));
                }
            }
            (kind, r) => {
                return Err(ProtoError::Malformed(format!(
                    "{r:?} parsed for a {kind:?}"
                )));
            }
        }
        let p = self.pending.pop_front().expect("front checked");
        Ok(Some((n, p.stamp)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(b: &[u8], kind: Kind) -> Result<Option<(usize, Reply<'_>)>, ProtoError> {
        parse(b, kind)
    }

    /// Every strict prefix is incomplete (never an error, never a reply); the whole is one
    /// reply taking every byte, also with the next reply's bytes behind it.
    fn splits_everywhere(b: &[u8], kind: Kind, want: &Reply) {
        for i in 0..b.len() {
            assert_eq!(
                parse(&b[..i], kind),
                Ok(None),
                "prefix {i} of {:?}",
                show(b)
            );
        }
        let (n, r) = whole(b, kind).unwrap().unwrap();
        assert_eq!((n, &r), (b.len(), want));
        let mut two = b.to_vec();
        two.extend_from_slice(b);
        assert_eq!(parse(&two, kind).unwrap().unwrap().0, b.len());
    }

    #[test]
    fn every_reply_split_at_every_byte_is_incomplete_until_its_last_byte() {
        splits_everywhere(b"STORED\r\n", Kind::Set, &Reply::Stored);
        splits_everywhere(b"END\r\n", Kind::Get, &Reply::Miss);
        splits_everywhere(
            b"VALUE zc1:k2 2 5\r\nab\r\nc\r\nEND\r\n",
            Kind::Get,
            &Reply::Hit {
                key: b"zc1:k2",
                flags: 2,
                data: b"ab\r\nc",
            },
        );
        splits_everywhere(
            b"VALUE k 0 0 77\r\n\r\nEND\r\n",
            Kind::Get,
            &Reply::Hit {
                key: b"k",
                flags: 0,
                data: b"",
            },
        );
    }

    #[test]
    fn data_that_looks_like_protocol_is_taken_as_data() {
        let b = b"VALUE k 0 13\r\nEND\r\nSTORED\r\n\r\nEND\r\n";
        let (n, r) = parse(b, Kind::Get).unwrap().unwrap();
        assert_eq!(n, b.len());
        assert_eq!(
            r,
            Reply::Hit {
                key: b"k",
                flags: 0,
                data: b"END\r\nSTORED\r\n"
            }
        );
    }

    #[test]
    fn server_errors_are_errors_with_their_text() {
        for (b, kind) in [
            (&b"ERROR\r\n"[..], Kind::Get),
            (b"CLIENT_ERROR bad data chunk\r\n", Kind::Set),
            (b"SERVER_ERROR out of memory storing object\r\n", Kind::Set),
        ] {
            match parse(b, kind) {
                Err(ProtoError::Server(t)) => {
                    assert!(b.starts_with(t.as_bytes()), "{t}")
                }
                r => panic!("{r:?} for {:?}", show(b)),
            }
            // Incomplete error lines wait like any line.
            assert_eq!(parse(&b[..b.len() - 1], kind), Ok(None));
        }
    }

    #[test]
    fn a_valid_reply_of_the_wrong_kind_is_unexpected() {
        for (b, kind) in [
            (&b"NOT_STORED\r\n"[..], Kind::Set),
            (b"EXISTS\r\n", Kind::Set),
            (b"END\r\n", Kind::Set),
            (b"STORED\r\n", Kind::Get),
            (b"NOT_FOUND\r\n", Kind::Get),
            (b"VALUE k 0 1\r\nx\r\nEND\r\n", Kind::Set),
        ] {
            assert!(
                matches!(parse(b, kind), Err(ProtoError::Unexpected { .. })),
                "{:?}",
                show(b)
            );
        }
    }

    #[test]
    fn garbage_is_refused_from_its_first_wrong_byte() {
        // Refused before any line end arrives.
        for b in [
            &b"H"[..],
            b"HTTP/1.1 200 OK",
            b"STOREX",
            b"ENDX",
            b"\r\n",
            b"\0",
        ] {
            assert!(
                matches!(parse(b, Kind::Get), Err(ProtoError::Malformed(_))),
                "{:?}",
                show(b)
            );
        }
        for b in [
            &b"STORED\n"[..],                         // LF without CR
            b"STORED \r\n",                           // trailing word
            b"END\r\r\n",                             // stray CR
            b"VALUE  0 1\r\nx\r\nEND\r\n",            // empty key
            b"VALUE k x 1\r\nx\r\nEND\r\n",           // flags not a number
            b"VALUE k 0 -1\r\nx\r\nEND\r\n",          // negative length
            b"VALUE k 0\r\nEND\r\n",                  // no length
            b"VALUE k 0 1 2 3\r\nx\r\nEND\r\n",       // extra word after cas
            b"VALUE k 99999999999 1\r\nx\r\nEND\r\n", // flags overflow u32
            b"VALUE k 0 99999999\r\n",                // larger than MAX_VALUE
            b"VALUE k 0 1\r\nxy\r\nEND\r\n",          // data longer than said
            b"VALUE k 0 2\r\nx\r\nEND\r\n",           // data shorter than said
            b"VALUE k 0 1\r\nx\r\nVALUE",             // a second value for a one-key get
            b"VALUE k 0 1\r\nx\r\nEN\n",
        ] {
            let mut is_err = false;
            for i in 1..=b.len() {
                // Once refused at some prefix, no longer prefix makes it acceptable.
                match parse(&b[..i], Kind::Get) {
                    Err(ProtoError::Malformed(_)) | Err(ProtoError::LineTooLong) => is_err = true,
                    Ok(None) => assert!(!is_err, "{:?} accepted after refusal", show(b)),
                    r => panic!("{r:?} for {:?}", show(b)),
                }
            }
            assert!(is_err, "{:?} not refused", show(b));
        }
    }

    #[test]
    fn a_line_without_end_is_refused_past_the_limit() {
        let mut b = b"SERVER_ERROR ".to_vec();
        b.resize(MAX_LINE, b'x');
        assert_eq!(parse(&b, Kind::Set), Ok(None));
        b.push(b'x');
        assert_eq!(parse(&b, Kind::Set), Err(ProtoError::LineTooLong));
    }

    fn mix() -> Mix {
        Mix {
            keys: 4,
            value_size: 40,
            get_percent: 50,
        }
    }

    /// The replies memcached gives, computed from the requests (a model of its store).
    fn serve(
        reqs: &[u8],
        store: &mut std::collections::HashMap<Vec<u8>, (u32, Vec<u8>)>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut b = reqs;
        while !b.is_empty() {
            let p = b.windows(2).position(|w| w == b"\r\n").unwrap();
            let l = std::str::from_utf8(&b[..p]).unwrap().to_string();
            b = &b[p + 2..];
            let w: Vec<&str> = l.split(' ').collect();
            match w[0] {
                "set" => {
                    let n: usize = w[4].parse().unwrap();
                    store.insert(w[1].into(), (w[2].parse().unwrap(), b[..n].to_vec()));
                    b = &b[n + 2..];
                    out.extend_from_slice(b"STORED\r\n");
                }
                "get" => {
                    if let Some((f, v)) = store.get(w[1].as_bytes()) {
                        write!(out, "VALUE {} {f} {}\r\n", w[1], v.len()).unwrap();
                        out.extend_from_slice(v);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"END\r\n");
                }
                _ => unreachable!(),
            }
        }
        out
    }

    #[test]
    fn pipelined_replies_split_anywhere_are_taken_in_order_with_their_stamps() {
        let mut s: Session<u32> = Session::new(3, mix());
        let mut reqs = Vec::new();
        s.get(&mut reqs, 0, 0); // never set: a miss is right
        for i in 1..200 {
            s.next(&mut reqs, i);
        }
        let mut store = Default::default();
        let replies = serve(&reqs, &mut store);
        // Fed in pieces split at each offset in turn.
        for cut in [1, 2, 3, 7, 13, 64] {
            let mut s2: Session<u32> = Session::new(3, mix());
            let mut r2 = Vec::new();
            s2.get(&mut r2, 0, 0);
            for i in 1..200 {
                s2.next(&mut r2, i);
            }
            assert_eq!(r2, reqs, "sessions are deterministic");
            let mut buf = Vec::new();
            let mut stamps = Vec::new();
            for chunk in replies.chunks(cut) {
                buf.extend_from_slice(chunk);
                while let Some((n, st)) = s2.take(&buf).unwrap() {
                    buf.drain(..n);
                    stamps.push(st);
                }
            }
            assert!(buf.is_empty());
            assert_eq!(stamps, (0..200).collect::<Vec<u32>>(), "cut {cut}");
            assert_eq!(s2.in_flight(), 0);
        }
    }

    #[test]
    fn a_value_from_another_key_or_an_older_set_is_a_mismatch() {
        let mut s: Session<()> = Session::new(1, mix());
        let mut reqs = Vec::new();
        s.set(&mut reqs, 2, ());
        s.set(&mut reqs, 2, ());
        s.get(&mut reqs, 2, ());
        let stored = b"STORED\r\nSTORED\r\n";
        let mut buf = stored.to_vec();
        let old = value(1, 2, 1, 40);
        write!(buf, "VALUE {} 2 40\r\n", key(1, 2)).unwrap();
        buf.extend_from_slice(&old);
        buf.extend_from_slice(b"\r\nEND\r\n");
        assert_eq!(s.take(&buf).unwrap().unwrap().0, 8);
        assert_eq!(s.take(&buf[8..]).unwrap().unwrap().0, 8);
        assert!(matches!(s.take(&buf[16..]), Err(ProtoError::Mismatch(_))));

        // The right data under another key, wrong flags, and a miss after a set.
        let right = value(1, 2, 2, 40);
        for (k, flags) in [(key(1, 3), 2), (key(1, 2), 3)] {
            let mut s: Session<()> = Session::new(1, mix());
            let mut reqs = Vec::new();
            s.set(&mut reqs, 2, ());
            s.set(&mut reqs, 2, ());
            s.get(&mut reqs, 2, ());
            let mut buf = Vec::new();
            write!(buf, "VALUE {k} {flags} 40\r\n").unwrap();
            buf.extend_from_slice(&right);
            buf.extend_from_slice(b"\r\nEND\r\n");
            s.take(stored).unwrap();
            s.take(&stored[8..]).unwrap();
            assert!(
                matches!(s.take(&buf), Err(ProtoError::Mismatch(_))),
                "{k} {flags}"
            );
        }
        let mut s: Session<()> = Session::new(1, mix());
        s.set(&mut Vec::new(), 0, ());
        s.get(&mut Vec::new(), 0, ());
        s.take(b"STORED\r\n").unwrap();
        assert!(matches!(s.take(b"END\r\n"), Err(ProtoError::Mismatch(_))));
    }

    #[test]
    fn a_reply_with_no_request_is_refused() {
        let mut s: Session<()> = Session::new(0, mix());
        assert_eq!(s.take(b""), Ok(None));
        assert!(matches!(
            s.take(b"STORED\r\n"),
            Err(ProtoError::Malformed(_))
        ));
    }

    #[test]
    fn values_name_their_key_and_version_and_have_the_asked_size() {
        let a = value(1, 2, 3, 64);
        assert_eq!(a.len(), 64);
        assert!(a.starts_with(b"1.2.3:"));
        assert_ne!(a, value(1, 2, 4, 64));
        assert_ne!(a, value(1, 3, 3, 64));
        assert_eq!(value(1, 2, 3, 4).len(), 4);
        assert!(value(0, 0, 1, 10).iter().all(|c| c.is_ascii_graphic()));
    }
}
