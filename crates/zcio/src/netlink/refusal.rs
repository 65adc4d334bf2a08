//! Why the kernel refused to bind an NFQUEUE queue or an NFLOG group.
//!
//! `nfqnl_recv_config` and `nfulnl_recv_config` answer `EPERM` when another socket holds the
//! queue or group (`inst->peer_portid != NETLINK_CB(skb).portid`), and nfnetlink answers
//! `EPERM` before either when the sender lacks CAP_NET_ADMIN (`netlink_net_capable`). The
//! errno cannot tell the two apart; two checks can: the calling thread's effective
//! capabilities (the kernel checks the sending thread), and the kernel's table of bound
//! instances (`/proc/thread-self/net/netfilter/nfnetlink_{queue,log}`: number, then the
//! holder's port id), whose holder is then named from `/proc/net/netlink` and the processes'
//! descriptors where they are visible.

use std::path::Path;

/// The kernel table of bound instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    /// NFQUEUE queues (`nfnetlink_queue`).
    Queue,
    /// NFLOG groups (`nfnetlink_log`).
    Log,
}

impl Table {
    fn file(self) -> &'static str {
        match self {
            Table::Queue => "nfnetlink_queue",
            Table::Log => "nfnetlink_log",
        }
    }
    fn noun(self) -> &'static str {
        match self {
            Table::Queue => "queue",
            Table::Log => "group",
        }
    }
}

/// The port id bound to `id` in the kernel's `table`, as the calling thread's network
/// namespace shows it (`None`: not bound there, or the table is not readable).
pub(crate) fn holder(table: Table, id: u16) -> Option<u32> {
    let path = format!("/proc/thread-self/net/netfilter/{}", table.file());
    let s = std::fs::read_to_string(&path)
        .or_else(|_| std::fs::read_to_string(format!("/proc/net/netfilter/{}", table.file())))
        .ok()?;
    s.lines().find_map(|l| {
        let mut f = l.split_whitespace().map(|x| x.parse::<u64>().ok());
        match (f.next()??, f.next()??) {
            (n, port) if n == u64::from(id) => Some(port as u32),
            _ => None,
        }
    })
}

/// The process holding netlink port `port` of protocol `protocol`: `pid (comm)`, when this
/// process can see it (`/proc/net/netlink` gives the socket's inode, the processes'
/// descriptors its owner).
fn process_of(protocol: i32, port: u32) -> Option<String> {
    let table = std::fs::read_to_string("/proc/thread-self/net/netlink")
        .or_else(|_| std::fs::read_to_string("/proc/net/netlink"))
        .ok()?;
    // sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
    let inode = table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 10
            && f[1].parse::<i32>().ok()? == protocol
            && f[2].parse::<u32>().ok()? == port)
            .then(|| f[9].to_string())
    })?;
    let want = format!("socket:[{inode}]");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l == Path::new(&want)) {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                return Some(format!("pid {pid} ({})", comm.trim()));
            }
        }
    }
    None
}

/// Why the kernel refused to bind a queue or group with `EPERM` or `EBUSY`, found by the
/// checks of the module docs (`EPERM` alone cannot tell the causes apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindRefusal {
    /// `EBUSY`: this socket has bound it already.
    BoundHere,
    /// `EPERM`, the sending thread has CAP_NET_ADMIN, and the kernel's table shows another
    /// socket bound to it.
    InUse {
        /// The holder's netlink port id.
        port: u32,
        /// `pid N (comm)` of the process holding that socket, when this process can see it.
        process: Option<String>,
    },
    /// `EPERM`, and the sending thread lacks CAP_NET_ADMIN in its effective set (the kernel
    /// checks that before anything else).
    NoCapability {
        /// Another socket's port id, when one also holds it.
        held_by: Option<u32>,
    },
    /// `EPERM` with CAP_NET_ADMIN and no holder in this network namespace's table: the
    /// capability counts in the user namespace owning the *socket's* network namespace, or
    /// the holder is in a namespace this process does not see.
    Unexplained,
}

impl BindRefusal {
    /// Checks why binding `id` in `table` was refused with `errno` (`None` for an errno other
    /// than `EPERM`/`EBUSY`); `ours` is the refused socket's port id.
    pub(crate) fn check(table: Table, id: u16, errno: i32, ours: Option<u32>) -> Option<Self> {
        let held = || holder(table, id).filter(|&p| Some(p) != ours);
        match errno {
            libc::EBUSY => Some(BindRefusal::BoundHere),
            libc::EPERM if !crate::sys::has_cap_net_admin() => {
                Some(BindRefusal::NoCapability { held_by: held() })
            }
            libc::EPERM => Some(match held() {
                Some(port) => BindRefusal::InUse {
                    port,
                    process: process_of(crate::sys::nfqueue::NETLINK_NETFILTER, port),
                },
                None => BindRefusal::Unexplained,
            }),
            _ => None,
        }
    }

    /// The explanation, appended to the error (`; ...`), for `table`'s `id`.
    pub(crate) fn hint(&self, table: Table, id: u16) -> String {
        let noun = table.noun();
        match self {
            BindRefusal::BoundHere => format!("; this socket has already bound {noun} {id}"),
            BindRefusal::InUse { port, process } => format!(
                "; {noun} {id} is in use: another socket is bound to it (netlink port {port}, \
                 {}); stop that program or choose another {noun}",
                process
                    .as_deref()
                    .unwrap_or("its process is not visible from here")
            ),
            BindRefusal::NoCapability { held_by } => format!(
                "; missing capability: the kernel requires CAP_NET_ADMIN of the thread that \
                 sends the request, and this one does not have it in its effective set (run \
                 as root, or give the program the capability: `setcap cap_net_admin+ep`, or \
                 `setpriv --inh-caps +net_admin --ambient-caps +net_admin`){}",
                held_by
                    .map(|p| format!(
                        "; {noun} {id} is also bound by another socket (netlink port {p})"
                    ))
                    .unwrap_or_default()
            ),
            BindRefusal::Unexplained => format!(
                "; {noun} {id} is not bound by another socket in this network namespace and \
                 this thread has CAP_NET_ADMIN: the kernel checks the capability in the user \
                 namespace that owns the socket's network namespace (a socket made in, or \
                 handed over from, another namespace), or another socket holds the {noun} in \
                 a namespace this process does not see"
            ),
        }
    }
}
