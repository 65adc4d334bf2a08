//! `zcio hosts`: create test hosts by hand (for experiments with `ip netns exec`), or remove
//! leftovers of killed runs.

use anyhow::{Context, Result};
use std::io::BufRead;
use zcio_testnet::{Pair, Sink};

/// Creates a veth pair of hosts and a sink host, prints them, holds them until `seconds`
/// pass (0: until Enter or end of input), then removes them.
pub fn up(seconds: u64) -> Result<()> {
    let pair = Pair::new("hosts").context("creating the host pair")?;
    let sink = Sink::new("hosts").context("creating the sink host")?;
    println!(
        "host A   {}  {} / {}  dev {}",
        pair.a.name(),
        pair.a4,
        pair.a6,
        pair.iface
    );
    println!(
        "host B   {}  {} / {}  dev {}",
        pair.b.name(),
        pair.b4,
        pair.b6,
        pair.iface
    );
    println!(
        "sink     {}  {} -> {} / {} -> {}  dev {} (peer down: packets dropped at the device)",
        sink.host.name(),
        sink.src4,
        sink.dst4,
        sink.src6,
        sink.dst6,
        sink.iface
    );
    println!("use: ip netns exec {} <command>", pair.a.name());
    if seconds > 0 {
        std::thread::sleep(std::time::Duration::from_secs(seconds));
    } else {
        println!("press Enter to remove them");
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
    }
    Ok(())
}

/// Removes namespaces of dead zcio processes.
pub fn cleanup() -> Result<()> {
    zcio_testnet::check_privileges()?;
    let n = zcio_testnet::cleanup_stale();
    println!("removed {n} stale namespace(s)");
    Ok(())
}
