//! `auto`'s COPIED verdict per route (peer address), shared by the ring's sockets to that peer.

use crate::stats::{self, Fallback};
use crate::tx::policy::CopiedWatch;
use crate::tx::sock::Sock;
use crate::tx::{Path, SenderConfig, TxMode};
use std::collections::HashMap;
use std::net::IpAddr;

/// The COPIED verdict of one route (a peer address) and how many of the ring's `auto`
/// sockets send to it (the entry goes with the last). Whether the kernel copies a zero-copy
/// send depends on where it goes (local delivery, a device without scatter-gather or
/// checksum offload), not on the socket: the first sockets' completions decide for every
/// socket to that peer, and one re-probe per route (not per socket) checks it again.
#[derive(Debug)]
pub(in crate::tx) struct Route {
    pub(in crate::tx) ip: IpAddr,
    pub(in crate::tx) watch: CopiedWatch,
    pub(in crate::tx) socks: u32,
}

/// The ring's routes: found by address when a socket is added, by index (kept in the
/// socket's `Auto`) on every send and completion, so the per-send path hashes nothing.
#[derive(Debug, Default)]
pub(in crate::tx) struct Routes {
    by_ip: HashMap<IpAddr, u32>,
    slots: Vec<Option<Route>>,
    free: Vec<u32>,
}

impl Routes {
    /// One more socket to `ip`: its route's index (a new route watches with `cfg`'s rules).
    pub(super) fn join(&mut self, ip: IpAddr, cfg: &SenderConfig) -> u32 {
        let id = match self.by_ip.get(&ip) {
            Some(&id) => id,
            None => {
                let r = Route {
                    ip,
                    watch: CopiedWatch::new(cfg.copied_streak, cfg.reprobe_every),
                    socks: 0,
                };
                let id = match self.free.pop() {
                    Some(id) => {
                        self.slots[id as usize] = Some(r);
                        id
                    }
                    None => {
                        self.slots.push(Some(r));
                        (self.slots.len() - 1) as u32
                    }
                };
                self.by_ip.insert(ip, id);
                id
            }
        };
        self.get_mut(id).socks += 1;
        id
    }

    /// A socket of route `id` has gone (`probe_out`: with the route's re-probe in flight);
    /// the route goes with its last socket.
    pub(super) fn leave(&mut self, id: u32, probe_out: bool) {
        let r = self.get_mut(id);
        if probe_out {
            r.watch.probe_lost();
        }
        r.socks -= 1;
        if r.socks == 0 {
            let ip = r.ip;
            self.slots[id as usize] = None;
            self.by_ip.remove(&ip);
            self.free.push(id);
        }
    }

    pub(super) fn get_mut(&mut self, id: u32) -> &mut Route {
        self.slots[id as usize]
            .as_mut()
            .expect("a route lives while its sockets do")
    }
}

pub(super) fn route_path(p: Path) -> stats::Path {
    stats::Path::Tx(p)
}

/// The COPIED watch an `auto` socket follows (its route's, or its own without a route),
/// and the route's peer address.
pub(super) fn watch_of<'a>(
    routes: &'a mut Routes,
    route: Option<u32>,
    own: &'a mut Option<CopiedWatch>,
) -> (&'a mut CopiedWatch, Option<IpAddr>) {
    match route {
        Some(id) => {
            let r = routes.get_mut(id);
            (&mut r.watch, Some(r.ip))
        }
        None => (
            own.as_mut()
                .expect("a socket without a route has its own watch"),
            None,
        ),
    }
}

/// An `auto` socket's path follows its route's COPIED verdict (`in_copy`); the first switch
/// to copy is recorded as a fallback, saying whether this socket's completions found it
/// (`streak`) or others' to the same peer did.
pub(super) fn follow_verdict(
    s: &mut Sock,
    in_copy: bool,
    copy: Path,
    interval: u64,
    streak: Option<u32>,
    peer: Option<IpAddr>,
) {
    let Some(a) = s.auto.as_mut() else { return };
    a.in_copy = in_copy;
    if !in_copy {
        s.path = a.zc.unwrap_or(copy);
        return;
    }
    s.path = copy;
    if a.noted {
        return;
    }
    a.noted = true;
    let from = a.zc.map_or(stats::Path::TxMode(TxMode::Auto), route_path);
    let whose = match (streak, peer) {
        (Some(n), _) => format!("{n} zero-copy completions in a row came back COPIED"),
        (None, Some(ip)) => format!(
            "zero-copy completions of this ring's sockets to {ip} came back COPIED (the \
             route's verdict: this socket made no probe of its own)"
        ),
        (None, None) => "zero-copy completions came back COPIED".to_string(),
    };
    let per = if peer.is_some() {
        "the route re-probed once"
    } else {
        "re-probing"
    };
    let reason = format!(
        "{whose}: this path copies anyway (loopback or local delivery), so zero-copy only \
         adds notification cost; sending by copy ({copy}), {per} every {interval} sends"
    );
    s.fallbacks.push(Fallback::new(from, copy, reason));
}
