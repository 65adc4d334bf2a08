//! A host with a large routing table, for measuring netlink dumps.

use crate::{Error, Netns, Result};
use std::io::Write;
use std::net::Ipv4Addr;

/// First address of the routes [`add_routes`] installs (198.18.0.0, in 198.18.0.0/15).
pub const ROUTE_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);

/// Adds a device `rt0` (one end of a veth pair) and `n` (≤ 131072) host routes `198.18.0.0 + i` via it to the
/// main table of `ns`, with one `ip -batch` run (100k routes take about a second).
pub fn add_routes(ns: &Netns, n: u32) -> Result<()> {
    let n = n.min(1 << 17);
    // A veth pair (the dummy driver is not always built): rt0 carries the routes.
    ns.ip(&["link", "add", "rt0", "type", "veth", "peer", "name", "rt1"])?;
    ns.ip(&["link", "set", "rt1", "up"])?;
    ns.ip(&["link", "set", "rt0", "up"])?;
    let io = |what: &str, e: std::io::Error| Error::Io {
        what: what.into(),
        source: e,
    };
    let dir = crate::TempDir::new("routes").map_err(|e| io("creating a temporary directory", e))?;
    let path = dir.join("batch");
    {
        let f = crate::tempdir::write_new(&path, b"", 0o600)
            .map_err(|e| io("creating the batch file", e))?;
        let mut w = std::io::BufWriter::new(f);
        let base = u32::from(ROUTE_BASE);
        for i in 0..n {
            writeln!(w, "route add {}/32 dev rt0", Ipv4Addr::from(base + i))
                .map_err(|e| io("writing the batch file", e))?;
        }
        w.flush().map_err(|e| io("writing the batch file", e))?;
    }
    let p = path.to_string_lossy().into_owned();
    ns.ip(&["-batch", &p]).map(drop)
}
