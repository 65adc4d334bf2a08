//! `zcio netlink dump routes|links|neigh|addrs`: rtnetlink dumps through the frame ring.

use anyhow::{Context, Result};
use std::io::Write;
use zcio::netlink::msg::attrs;
use zcio::netlink::{link_names, DumpKind, Route, RouteSocket};

/// What to dump, as typed on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum What {
    /// Routes (main table, like `ip route show`; `--all-tables` for every table).
    Routes,
    /// Links.
    Links,
    /// Neighbours.
    Neigh,
    /// Addresses.
    Addrs,
}

/// Options of `zcio netlink dump`.
#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// What to dump.
    pub what: What,
    /// Address family: 4, 6 or 0 (all). Routes default to 4, like `ip route show`.
    #[arg(long)]
    pub family: Option<u8>,
    /// Routes of every table, not just main.
    #[arg(long)]
    pub all_tables: bool,
    /// Print only the count and the cost (messages, datagrams, syscalls).
    #[arg(long)]
    pub count: bool,
    /// Fill frames with io_uring multishot recv instead of recvmmsg.
    #[arg(long)]
    pub uring: bool,
}

fn family(f: Option<u8>, default: u8) -> u8 {
    match f.unwrap_or(default) {
        4 => libc::AF_INET as u8,
        6 => libc::AF_INET6 as u8,
        _ => 0,
    }
}

/// Dumps routes of the main table (or all) formatted like `ip route show` into `out`;
/// returns the number of routes and the dump statistics.
pub fn dump_routes(
    sock: &mut RouteSocket,
    fam: u8,
    all_tables: bool,
    out: &mut String,
) -> Result<(u64, zcio::netlink::DumpStats)> {
    let names = link_names(sock).context("link dump")?;
    let mut n = 0u64;
    let st = sock.dump(DumpKind::Routes, fam, |m| {
        if let Ok(r) = Route::parse(m) {
            if all_tables || r.table == 254 {
                r.format_named(out, &names);
                n += 1;
            }
        }
    })?;
    Ok((n, st))
}

/// Runs the subcommand.
pub fn run(a: DumpArgs) -> Result<()> {
    let mut sock = RouteSocket::new(64, 8 << 20).context("opening the rtnetlink socket")?;
    if a.uring {
        sock.use_uring();
    }
    // Every fallback taken, the receive buffer's included (SO_RCVBUFFORCE without
    // CAP_NET_ADMIN).
    for f in zcio::stats::Report::fallbacks(&sock) {
        eprintln!("zcio netlink dump: fallback {f}");
    }
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut text = String::with_capacity(1 << 20);
    let (n, st) = match a.what {
        What::Routes => dump_routes(&mut sock, family(a.family, 4), a.all_tables, &mut text)?,
        other => {
            let kind = match other {
                What::Links => DumpKind::Links,
                What::Neigh => DumpKind::Neigh,
                _ => DumpKind::Addrs,
            };
            let hdr = kind.header_len();
            let mut n = 0;
            let st = sock.dump(kind, family(a.family, 0), |m| {
                n += 1;
                format_generic(kind, m.payload, hdr, &mut text);
            })?;
            (n, st)
        }
    };
    if !a.count {
        w.write_all(text.as_bytes())?;
    }
    w.flush()?;
    eprintln!(
        "{n} objects; {} messages in {} datagrams ({} bytes) via {}, {} receive syscalls, {} COPY frames{}",
        st.messages,
        st.datagrams,
        st.bytes,
        sock.path(),
        st.frames.syscalls,
        st.frames.copies,
        if st.interrupted {
            "; dump INTERRUPTED (table changed), rerun"
        } else {
            ""
        }
    );
    Ok(())
}

fn format_generic(kind: DumpKind, p: &[u8], hdr: usize, out: &mut String) {
    use std::fmt::Write as _;
    if p.len() < hdr {
        return;
    }
    let at = |i: usize| u32::from_ne_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    match kind {
        DumpKind::Links => {
            let _ = write!(out, "{}:", at(4));
        }
        DumpKind::Addrs => {
            let _ = write!(out, "{}: family {} /{}", at(4), p[0], p[1]);
        }
        _ => {
            let _ = write!(
                out,
                "dev {} family {} state {:#x}",
                at(4),
                p[0],
                u16::from_ne_bytes([p[8], p[9]])
            );
        }
    }
    for a in attrs(&p[hdr..]).flatten() {
        match (kind, a.ty, a.value.len()) {
            (DumpKind::Links, 3, _) => {
                let n = a.value.split(|&b| b == 0).next().unwrap_or(&[]);
                let _ = write!(out, " {}", String::from_utf8_lossy(n));
            }
            (DumpKind::Addrs, 1, 4) | (DumpKind::Neigh, 1, 4) => {
                let v = a.value;
                let _ = write!(out, " {}", std::net::Ipv4Addr::new(v[0], v[1], v[2], v[3]));
            }
            (DumpKind::Addrs, 1, 16) | (DumpKind::Neigh, 1, 16) => {
                let mut b = [0u8; 16];
                b.copy_from_slice(a.value);
                let _ = write!(out, " {}", std::net::Ipv6Addr::from(b));
            }
            (DumpKind::Neigh, 2, 6) => {
                let v = a.value;
                let _ = write!(
                    out,
                    " lladdr {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                    v[0], v[1], v[2], v[3], v[4], v[5]
                );
            }
            _ => {}
        }
    }
    out.push('\n');
}
