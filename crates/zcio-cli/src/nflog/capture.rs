//! Capture files for `zcio nflog`: pcapng (a section header, one interface description block
//! per network interface the packets were logged on, an enhanced packet block per packet with
//! the rule's prefix as its comment and the direction in its flags) or classic pcap; to a file
//! (rotated by size or time, like tcpdump's `-C`/`-G`) or to stdout.
//!
//! Block headers (and small packets) are built in one buffer; a packet's bytes of 256 or more
//! stay where they are — in the frame the kernel received them into — and go out with the
//! headers in one `writev` per receive batch ([`Writer::batch`]): no copy in user space, no
//! syscall per packet. A buffer with no such reference waits for 1 MiB, an idle consumer or a
//! rotation before it is written.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `LINKTYPE_RAW`: the packet starts with its IPv4 or IPv6 header.
pub const LINKTYPE_RAW: u16 = 101;
/// `LINKTYPE_ETHERNET`.
pub const LINKTYPE_ETHERNET: u16 = 1;

/// File format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// pcapng: interface blocks, packet comments.
    Pcapng,
    /// Classic pcap (one link type for the file, no comments).
    Pcap,
}

/// When to start the next file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rotation {
    /// After this many bytes (`-C`).
    pub size: Option<u64>,
    /// After this long (`-G`).
    pub every: Option<Duration>,
}

/// Where packets go.
enum Sink {
    File(File),
    Stdout(io::Stdout),
}

impl Sink {
    /// Writes every byte of `parts` (one `writev`; after a short write, another for the rest).
    fn write_all_vectored(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let mut out: Box<dyn Write + '_> = match self {
            Sink::File(f) => Box::new(f),
            Sink::Stdout(s) => Box::new(s.lock()),
        };
        let mut rest: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
        while !rest.is_empty() {
            let iov: Vec<io::IoSlice<'_>> = rest.iter().map(|p| io::IoSlice::new(p)).collect();
            let mut n = match out.write_vectored(&iov) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            // Drop what was written: whole parts, then the start of a partly written one.
            let mut done = 0;
            while done < rest.len() && n >= rest[done].len() {
                n -= rest[done].len();
                done += 1;
            }
            rest.drain(..done);
            if let Some(first) = rest.first_mut() {
                *first = &first[n..];
            }
        }
        out.flush()
    }
}

/// Payloads this long or longer are written from where they lie; shorter ones are copied
/// into the buffer (an iovec entry costs more than copying a few dozen bytes).
const REFERENCE_FROM: usize = 256;

/// Part of what a batch writes: bytes of the writer's buffer, or a packet's bytes elsewhere.
enum Part<'a> {
    Own(std::ops::Range<usize>),
    Ext(&'a [u8]),
}

/// Packets of one receive batch on their way to a [`Writer`]: see [`Writer::batch`].
pub struct Batch<'w, 'a> {
    w: &'w mut Writer,
    parts: Vec<Part<'a>>,
    /// Start of the buffer bytes not yet in `parts`.
    run: usize,
}

impl<'a> Batch<'_, 'a> {
    /// Adds one packet (rotating first, after writing what came before, when the current file
    /// is full or old enough).
    pub fn write(&mut self, r: &Record<'a>) -> io::Result<()> {
        if self.w.rotation_due() {
            self.flush_parts()?;
            self.w.rotate()?;
            self.run = 0;
        }
        let r = &r.cut(self.w.snaplen);
        let w = &mut *self.w;
        let start = w.buf.len();
        let ext = r.data.len() >= REFERENCE_FROM;
        match w.format {
            Format::Pcapng => {
                let id = w.iface(r.ifindex, r.linktype);
                let start = w.buf.len();
                let us = r.ts.0.saturating_mul(1_000_000).saturating_add(r.ts.1);
                w.buf.extend_from_slice(&6u32.to_le_bytes());
                w.buf.extend_from_slice(&[0; 4]);
                w.buf.extend_from_slice(&id.to_le_bytes());
                w.buf.extend_from_slice(&((us >> 32) as u32).to_le_bytes());
                w.buf.extend_from_slice(&(us as u32).to_le_bytes());
                let cap = r.l2.len() + r.data.len();
                w.buf.extend_from_slice(&(cap as u32).to_le_bytes());
                w.buf.extend_from_slice(&r.orig_len.to_le_bytes());
                w.buf.extend_from_slice(r.l2);
                if ext {
                    if w.buf.len() > self.run {
                        self.parts.push(Part::Own(self.run..w.buf.len()));
                    }
                    self.parts.push(Part::Ext(r.data));
                    self.run = w.buf.len();
                } else {
                    w.buf.extend_from_slice(r.data);
                }
                let pad = pad4(cap) - cap;
                w.buf.extend_from_slice(&[0u8; 3][..pad]);
                let mut opts = false;
                if let Some(c) = r.comment.filter(|c| !c.is_empty()) {
                    opt(&mut w.buf, 1, &c[..c.len().min(65_000)]);
                    opts = true;
                }
                if r.direction != 0 {
                    opt(&mut w.buf, 2, &r.direction.to_le_bytes());
                    opts = true;
                }
                if opts {
                    w.buf.extend_from_slice(&[0, 0, 0, 0]);
                }
                // The block's length: what is in the buffer plus the referenced bytes, and
                // the trailing copy.
                let len = (w.buf.len() - start + if ext { r.data.len() } else { 0 } + 4) as u32;
                w.buf.extend_from_slice(&len.to_le_bytes());
                w.buf[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
            }
            Format::Pcap => {
                match w.pcap_linktype {
                    None => {
                        w.pcap_linktype = Some(r.linktype);
                        w.buf.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
                        w.buf.extend_from_slice(&2u16.to_le_bytes());
                        w.buf.extend_from_slice(&4u16.to_le_bytes());
                        w.buf.extend_from_slice(&0i32.to_le_bytes());
                        w.buf.extend_from_slice(&0u32.to_le_bytes());
                        w.buf.extend_from_slice(&w.snaplen.to_le_bytes());
                        w.buf
                            .extend_from_slice(&u32::from(r.linktype).to_le_bytes());
                    }
                    Some(l) if l != r.linktype => {
                        // Classic pcap has one link type per file.
                        w.skipped += 1;
                        return Ok(());
                    }
                    Some(_) => {}
                }
                w.buf.extend_from_slice(&(r.ts.0 as u32).to_le_bytes());
                w.buf.extend_from_slice(&(r.ts.1 as u32).to_le_bytes());
                w.buf
                    .extend_from_slice(&((r.l2.len() + r.data.len()) as u32).to_le_bytes());
                w.buf.extend_from_slice(&r.orig_len.to_le_bytes());
                w.buf.extend_from_slice(r.l2);
                if ext {
                    if w.buf.len() > self.run {
                        self.parts.push(Part::Own(self.run..w.buf.len()));
                    }
                    self.parts.push(Part::Ext(r.data));
                    self.run = w.buf.len();
                } else {
                    w.buf.extend_from_slice(r.data);
                }
            }
        }
        w.file_bytes += (w.buf.len() - start + if ext { r.data.len() } else { 0 }) as u64;
        w.file_packets += 1;
        w.packets += 1;
        Ok(())
    }

    /// Replaces the interface names (see [`Writer::set_names`]).
    pub fn set_names(&mut self, names: HashMap<u32, String>) {
        self.w.set_names(names);
    }

    /// Writes the parts gathered so far (with the buffer bytes after the last of them).
    fn flush_parts(&mut self) -> io::Result<()> {
        let w = &mut *self.w;
        if self.parts.is_empty() {
            return Ok(());
        }
        if w.buf.len() > self.run {
            self.parts.push(Part::Own(self.run..w.buf.len()));
        }
        let iov: Vec<&[u8]> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Own(r) => &w.buf[r.clone()],
                Part::Ext(s) => *s,
            })
            .collect();
        let bytes: usize = iov.iter().map(|s| s.len()).sum();
        w.sink.write_all_vectored(&iov)?;
        w.writes += 1;
        w.bytes += bytes as u64;
        w.buf.clear();
        self.parts.clear();
        self.run = 0;
        Ok(())
    }

    /// Ends the batch: writes it if any packet was referenced (its frame is about to be
    /// given back), or the buffer once it holds 1 MiB; otherwise the bytes wait in the buffer.
    pub fn finish(mut self) -> io::Result<()> {
        if !self.parts.is_empty() {
            self.flush_parts()
        } else if self.w.buf.len() >= BUF {
            self.w.flush()
        } else {
            Ok(())
        }
    }
}

/// One packet to write.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Seconds and microseconds since the epoch.
    pub ts: (u64, u64),
    /// The interface it was logged on (index; `None`: unknown).
    pub ifindex: Option<u32>,
    /// Link type of the packet (`l2` then `data`).
    pub linktype: u16,
    /// A link-layer header written before `data` (an Ethernet header from NFLOG's
    /// `NFULA_HWHEADER` for a packet that is not IP), or nothing.
    pub l2: &'a [u8],
    /// The bytes (cut to the copy range).
    pub data: &'a [u8],
    /// The packet's full length.
    pub orig_len: u32,
    /// The rule's prefix (pcapng: the packet comment).
    pub comment: Option<&'a [u8]>,
    /// pcapng `epb_flags` direction: 1 inbound, 2 outbound, 0 unknown.
    pub direction: u32,
}

impl<'a> Record<'a> {
    /// The record cut to `snaplen` bytes (link-layer header first). The kernel cuts packets to
    /// the copy range already, but a packet logged while the group was being bound can carry
    /// the kernel's default range (the whole packet), and the file's header promises `snaplen`.
    fn cut(&self, snaplen: u32) -> Record<'a> {
        let snap = snaplen as usize;
        let l2 = &self.l2[..self.l2.len().min(snap)];
        let data = &self.data[..self.data.len().min(snap - l2.len())];
        Record { l2, data, ..*self }
    }
}

/// A rotating capture writer.
pub struct Writer {
    format: Format,
    snaplen: u32,
    base: Option<PathBuf>,
    rotation: Rotation,
    sink: Sink,
    buf: Vec<u8>,
    /// Bytes in the current file (written and buffered).
    file_bytes: u64,
    /// Packets in the current file.
    file_packets: u64,
    file_started: Instant,
    /// Files opened so far (the first is `base`, then `base1`, `base2`, … as tcpdump names them).
    files: u32,
    /// Interface blocks of the current file: (ifindex, linktype) → interface id.
    ifaces: HashMap<(Option<u32>, u16), u32>,
    /// The last interface looked up (packets mostly come from one: no hashing).
    last_iface: Option<((Option<u32>, u16), u32)>,
    /// The classic pcap file's link type, once written.
    pcap_linktype: Option<u16>,
    names: HashMap<u32, String>,
    /// Packets not written (classic pcap with a second link type).
    pub skipped: u64,
    /// Packets written.
    pub packets: u64,
    /// Bytes written, every file.
    pub bytes: u64,
    /// `write` calls.
    pub writes: u64,
}

const BUF: usize = 1 << 20;

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends one pcapng option (code, value, padding).
fn opt(out: &mut Vec<u8>, code: u16, v: &[u8]) {
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&(v.len() as u16).to_le_bytes());
    out.extend_from_slice(v);
    out.resize(out.len() + pad4(v.len()) - v.len(), 0);
}

/// Closes a block that starts at `start`: end-of-options when `opts`, trailing length, and the
/// length in its header.
fn end_block(out: &mut Vec<u8>, start: usize, opts: bool) {
    if opts {
        out.extend_from_slice(&[0, 0, 0, 0]);
    }
    let len = (out.len() - start + 4) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

impl Writer {
    /// A writer to `path` (`None` or `-`: stdout; rotation needs a file), with link-layer
    /// `names` for the interface blocks.
    pub fn new(
        format: Format,
        path: Option<&Path>,
        snaplen: u32,
        rotation: Rotation,
        names: HashMap<u32, String>,
    ) -> io::Result<Self> {
        let base = path.filter(|p| p.as_os_str() != "-").map(Path::to_path_buf);
        if base.is_none() && (rotation.size.is_some() || rotation.every.is_some()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "rotation (-C, -G) needs a file name (-w FILE)",
            ));
        }
        let sink = match &base {
            Some(p) => Sink::File(File::create(p)?),
            None => Sink::Stdout(io::stdout()),
        };
        let mut w = Self {
            format,
            snaplen,
            base,
            rotation,
            sink,
            buf: Vec::with_capacity(BUF + 128 * 1024),
            file_bytes: 0,
            file_packets: 0,
            file_started: Instant::now(),
            files: 1,
            ifaces: HashMap::new(),
            last_iface: None,
            pcap_linktype: None,
            names,
            skipped: 0,
            packets: 0,
            bytes: 0,
            writes: 0,
        };
        w.start_file();
        Ok(w)
    }

    /// The name of file number `n` (0-based): `base`, `base1`, `base2`, …
    fn file_name(base: &Path, n: u32) -> PathBuf {
        if n == 0 {
            return base.to_path_buf();
        }
        let mut s = base.as_os_str().to_os_string();
        s.push(n.to_string());
        PathBuf::from(s)
    }

    /// Replaces the interface names (for interfaces that appeared after the start).
    pub fn set_names(&mut self, names: HashMap<u32, String>) {
        self.names = names;
    }

    /// Files written so far.
    pub fn files(&self) -> u32 {
        self.files
    }

    fn start_file(&mut self) {
        self.ifaces.clear();
        self.last_iface = None;
        self.pcap_linktype = None;
        self.file_started = Instant::now();
        self.file_bytes = 0;
        self.file_packets = 0;
        if self.format == Format::Pcapng {
            let start = self.buf.len();
            self.buf.extend_from_slice(&0x0A0D_0D0Au32.to_le_bytes());
            self.buf.extend_from_slice(&[0; 4]);
            self.buf.extend_from_slice(&0x1A2B_3C4Du32.to_le_bytes());
            self.buf.extend_from_slice(&1u16.to_le_bytes());
            self.buf.extend_from_slice(&0u16.to_le_bytes());
            self.buf.extend_from_slice(&u64::MAX.to_le_bytes());
            let app = format!("zcio {} (nflog)", env!("CARGO_PKG_VERSION"));
            opt(&mut self.buf, 4, app.as_bytes());
            end_block(&mut self.buf, start, true);
            self.file_bytes += (self.buf.len() - start) as u64;
        }
    }

    fn iface_name(&self, ifindex: Option<u32>) -> String {
        match ifindex {
            Some(i) => self
                .names
                .get(&i)
                .cloned()
                .unwrap_or_else(|| format!("if{i}")),
            None => "nflog".into(),
        }
    }

    /// The interface id for a packet, writing its description block first if it is new in
    /// this file.
    fn iface(&mut self, ifindex: Option<u32>, linktype: u16) -> u32 {
        let key = (ifindex, linktype);
        if let Some((k, id)) = self.last_iface {
            if k == key {
                return id;
            }
        }
        if let Some(&id) = self.ifaces.get(&key) {
            self.last_iface = Some((key, id));
            return id;
        }
        let id = self.ifaces.len() as u32;
        self.ifaces.insert(key, id);
        self.last_iface = Some((key, id));
        let name = self.iface_name(ifindex);
        let start = self.buf.len();
        self.buf.extend_from_slice(&1u32.to_le_bytes());
        self.buf.extend_from_slice(&[0; 4]);
        self.buf.extend_from_slice(&linktype.to_le_bytes());
        self.buf.extend_from_slice(&0u16.to_le_bytes());
        self.buf.extend_from_slice(&self.snaplen.to_le_bytes());
        opt(&mut self.buf, 2, name.as_bytes());
        opt(&mut self.buf, 3, b"NFLOG (zcio)");
        // if_tsresol: microseconds (the default, stated for readers that want it).
        opt(&mut self.buf, 9, &[6]);
        end_block(&mut self.buf, start, true);
        self.file_bytes += (self.buf.len() - start) as u64;
        id
    }

    /// Starts a receive batch: packets written to it may reference bytes that live until
    /// [`Batch::finish`] (their frames), which writes them.
    pub fn batch<'a>(&mut self) -> Batch<'_, 'a> {
        // Everything already buffered (headers, small packets of earlier batches) goes out
        // first: the first run of buffer bytes starts at 0.
        Batch {
            w: self,
            parts: Vec::new(),
            run: 0,
        }
    }

    /// Writes one packet on its own (a batch of one).
    #[cfg(test)]
    pub fn write(&mut self, r: &Record<'_>) -> io::Result<()> {
        let mut b = self.batch();
        b.write(r)?;
        b.finish()
    }

    /// Whether the current file is full (`-C`) or old enough (`-G`) and has a packet.
    fn rotation_due(&self) -> bool {
        if self.base.is_none() || self.file_packets == 0 {
            return false;
        }
        self.rotation.size.is_some_and(|s| self.file_bytes >= s)
            || self
                .rotation
                .every
                .is_some_and(|d| self.file_started.elapsed() >= d)
    }

    /// Writes what is buffered and starts the next file.
    fn rotate(&mut self) -> io::Result<()> {
        let Some(base) = self.base.clone() else {
            return Ok(());
        };
        self.flush()?;
        let next = Self::file_name(&base, self.files);
        self.sink = Sink::File(File::create(&next)?);
        self.files += 1;
        self.start_file();
        Ok(())
    }

    /// Writes what is buffered (one `write`).
    pub fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let buf = std::mem::take(&mut self.buf);
        let r = self.sink.write_all_vectored(&[&buf]);
        self.buf = buf;
        r?;
        self.writes += 1;
        self.bytes += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the packets of a pcapng buffer: (interface name, data, comment, flags).
    fn read_pcapng(b: &[u8]) -> Vec<(String, Vec<u8>, Option<String>, u32)> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let mut names = Vec::new();
        let mut out = Vec::new();
        let mut o = 0;
        while o < b.len() {
            let ty = u32_at(o);
            let len = u32_at(o + 4) as usize;
            assert_eq!(u32_at(o + len - 4) as usize, len, "trailing length");
            let opts = |mut p: usize, end: usize| {
                let mut v = Vec::new();
                while p + 4 <= end {
                    let code = u16::from_le_bytes([b[p], b[p + 1]]);
                    let l = u16::from_le_bytes([b[p + 2], b[p + 3]]) as usize;
                    if code == 0 {
                        break;
                    }
                    v.push((code, b[p + 4..p + 4 + l].to_vec()));
                    p += 4 + pad4(l);
                }
                v
            };
            match ty {
                0x0A0D_0D0A => {
                    assert_eq!(u32_at(o + 8), 0x1A2B_3C4D);
                    names.clear();
                }
                1 => {
                    let name = opts(o + 16, o + len - 4)
                        .into_iter()
                        .find(|(c, _)| *c == 2)
                        .map(|(_, v)| String::from_utf8(v).unwrap())
                        .unwrap();
                    names.push(name);
                }
                6 => {
                    let id = u32_at(o + 8) as usize;
                    let cap = u32_at(o + 20) as usize;
                    let data = b[o + 28..o + 28 + cap].to_vec();
                    let os = opts(o + 28 + pad4(cap), o + len - 4);
                    let comment = os
                        .iter()
                        .find(|(c, _)| *c == 1)
                        .map(|(_, v)| String::from_utf8(v.clone()).unwrap());
                    let flags = os
                        .iter()
                        .find(|(c, _)| *c == 2)
                        .map_or(0, |(_, v)| u32::from_le_bytes(v[..4].try_into().unwrap()));
                    out.push((names[id].clone(), data, comment, flags));
                }
                t => panic!("block type {t:#x}"),
            }
            o += len;
        }
        out
    }

    #[test]
    fn pcapng_blocks_carry_interfaces_comments_and_directions() {
        let dir = zcio_testnet::tempdir::TempDir::new("pcapng").unwrap();
        let path = dir.join("a.pcapng");
        let names = HashMap::from([(1, "lo".to_string()), (7, "veth0".to_string())]);
        let mut w = Writer::new(
            Format::Pcapng,
            Some(&path),
            65535,
            Rotation::default(),
            names,
        )
        .unwrap();
        type Pkt<'a> = (Option<u32>, &'a [u8], Option<&'a [u8]>, u32);
        let pkts: [Pkt<'_>; 4] = [
            (Some(1), &[0x45, 1, 2], Some(b"in"), 1),
            (Some(7), &[0x60, 1, 2, 3, 4], None, 2),
            (Some(1), &[0x45; 9], Some(b"again"), 0),
            (Some(9), &[0x45], None, 1),
        ];
        for (i, (ifindex, data, comment, direction)) in pkts.iter().enumerate() {
            w.write(&Record {
                ts: (1_700_000_000 + i as u64, 5),
                ifindex: *ifindex,
                linktype: LINKTYPE_RAW,
                l2: &[],
                data,
                orig_len: data.len() as u32 + 10,
                comment: *comment,
                direction: *direction,
            })
            .unwrap();
        }
        w.flush().unwrap();
        assert_eq!(w.writes, 1, "one write for everything buffered");
        let got = read_pcapng(&std::fs::read(&path).unwrap());
        assert_eq!(got.len(), 4);
        assert_eq!(
            got[0],
            ("lo".into(), vec![0x45, 1, 2], Some("in".into()), 1)
        );
        assert_eq!(got[1], ("veth0".into(), vec![0x60, 1, 2, 3, 4], None, 2));
        assert_eq!(
            got[2].0, "lo",
            "an interface block is written once per file"
        );
        assert_eq!(got[3].0, "if9", "unknown indices are named by number");
    }

    #[test]
    fn rotation_by_size_starts_numbered_files_that_each_stand_alone() {
        let dir = zcio_testnet::tempdir::TempDir::new("rot").unwrap();
        let path = dir.join("r.pcapng");
        let mut w = Writer::new(
            Format::Pcapng,
            Some(&path),
            65535,
            Rotation {
                size: Some(1000),
                every: None,
            },
            HashMap::from([(1, "lo".to_string())]),
        )
        .unwrap();
        // One batch: short packets copied, long ones (300 bytes) written from where they lie,
        // rotating in the middle of the batch.
        let pkts: Vec<Vec<u8>> = (0..30u8)
            .map(|i| vec![i; if i % 2 == 0 { 100 } else { 300 }])
            .collect();
        let mut b = w.batch();
        for p in &pkts {
            b.write(&Record {
                ts: (1, 0),
                ifindex: Some(1),
                linktype: LINKTYPE_RAW,
                l2: &[],
                data: p,
                orig_len: p.len() as u32,
                comment: Some(b"c"),
                direction: 1,
            })
            .unwrap();
        }
        b.finish().unwrap();
        w.flush().unwrap();
        assert!(w.files() >= 3, "{} files", w.files());
        let mut all = Vec::new();
        for n in 0..w.files() {
            let f = Writer::file_name(&path, n);
            let b = std::fs::read(&f).unwrap();
            assert!(
                b.len() <= 1000 + 200,
                "{} holds {} bytes",
                f.display(),
                b.len()
            );
            all.extend(read_pcapng(&b).into_iter().map(|p| p.1[0]));
        }
        assert_eq!(
            all,
            (0..30).collect::<Vec<u8>>(),
            "every packet once, in order"
        );
    }

    #[test]
    fn classic_pcap_has_one_link_type_and_skips_others() {
        let dir = zcio_testnet::tempdir::TempDir::new("pcap").unwrap();
        let path = dir.join("c.pcap");
        let mut w = Writer::new(
            Format::Pcap,
            Some(&path),
            128,
            Rotation::default(),
            HashMap::new(),
        )
        .unwrap();
        for lt in [LINKTYPE_RAW, LINKTYPE_ETHERNET, LINKTYPE_RAW] {
            w.write(&Record {
                ts: (7, 8),
                ifindex: None,
                linktype: lt,
                l2: &[],
                data: &[0x45, 0, 0, 4],
                orig_len: 4,
                comment: Some(b"ignored"),
                direction: 1,
            })
            .unwrap();
        }
        w.flush().unwrap();
        assert_eq!((w.packets, w.skipped), (2, 1));
        let b = std::fs::read(&path).unwrap();
        assert_eq!(b.len(), 24 + 2 * (16 + 4));
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 101);
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 128);
    }

    #[test]
    fn records_are_cut_to_the_snap_length_the_header_states() {
        let dir = zcio_testnet::tempdir::TempDir::new("snap").unwrap();
        let eth = [0xaa; 14];
        let long = [0x45; 600];
        for format in [Format::Pcapng, Format::Pcap] {
            let path = dir.join(format!("{format:?}"));
            let mut w =
                Writer::new(format, Some(&path), 64, Rotation::default(), HashMap::new()).unwrap();
            // A short one, one past the snap length in its payload (written from the frame
            // when whole), one whose link-layer header counts against it.
            for (linktype, l2, data) in [
                (LINKTYPE_RAW, &[][..], &long[..20]),
                (LINKTYPE_RAW, &[][..], &long[..]),
                (LINKTYPE_ETHERNET, &eth[..], &long[..]),
            ] {
                w.write(&Record {
                    ts: (1, 2),
                    ifindex: Some(1),
                    linktype,
                    l2,
                    data,
                    orig_len: (l2.len() + data.len()) as u32,
                    comment: None,
                    direction: 0,
                })
                .unwrap();
            }
            w.flush().unwrap();
            let b = std::fs::read(&path).unwrap();
            let caps: Vec<usize> = match format {
                Format::Pcapng => read_pcapng(&b).into_iter().map(|p| p.1.len()).collect(),
                Format::Pcap => {
                    // Classic pcap keeps one link type: the Ethernet record is skipped.
                    let mut o = 24;
                    let mut v = Vec::new();
                    while o < b.len() {
                        let cap = u32::from_le_bytes(b[o + 8..o + 12].try_into().unwrap());
                        let orig = u32::from_le_bytes(b[o + 12..o + 16].try_into().unwrap());
                        assert!(orig == 20 || orig == 600, "original length kept: {orig}");
                        v.push(cap as usize);
                        o += 16 + cap as usize;
                    }
                    v
                }
            };
            let want: &[usize] = match format {
                Format::Pcapng => &[20, 64, 64],
                Format::Pcap => &[20, 64],
            };
            assert_eq!(caps, want, "{format:?}");
        }
    }

    #[test]
    fn rotation_needs_a_file() {
        assert!(Writer::new(
            Format::Pcapng,
            None,
            1,
            Rotation {
                size: Some(1),
                every: None
            },
            HashMap::new()
        )
        .is_err());
    }
}
