//! NFQUEUE availability: a real bind (and unbind) of a high queue number.

use super::{errno_name, Check};
use crate::sys::{self, net, nfqueue as nfq};

/// Queue number used for the probe's bind attempt (chosen to be unlikely in use).
const PROBE_QUEUE: u16 = 65_531;

fn config_msg(seq: u32, queue: u16, command: u8) -> Vec<u8> {
    let mut m = Vec::with_capacity(28);
    let ty = (nfq::NFNL_SUBSYS_QUEUE << 8) | nfq::NFQNL_MSG_CONFIG;
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    m.extend_from_slice(&28u32.to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // struct nfgenmsg: family, version, res_id (big endian queue number)
    m.push(libc::AF_UNSPEC as u8);
    m.push(nfq::NFNETLINK_V0);
    m.extend_from_slice(&queue.to_be_bytes());
    // NFQA_CFG_CMD: struct nfqnl_msg_config_cmd { u8 command; u8 pad; be16 pf; }
    m.extend_from_slice(&8u16.to_ne_bytes());
    m.extend_from_slice(&nfq::NFQA_CFG_CMD.to_ne_bytes());
    m.push(command);
    m.push(0);
    m.extend_from_slice(&0u16.to_be_bytes());
    m
}

/// Sends a config command and returns the kernel's ack errno (0 = success).
fn command(fd: &std::os::fd::OwnedFd, seq: u32, command: u8) -> std::io::Result<i32> {
    net::send(fd, &config_msg(seq, PROBE_QUEUE, command), 0)?;
    let mut buf = [0u8; 256];
    loop {
        if net::poll_one(fd, libc::POLLIN, 1000)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no ack from nfnetlink",
            ));
        }
        let n = net::recv(fd, &mut buf, 0)?;
        if n < 20 {
            continue;
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        let rseq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if ty == libc::NLMSG_ERROR as u16 && rseq == seq {
            let err = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            return Ok(-err);
        }
    }
}

/// Tries to bind an NFQUEUE queue.
pub(crate) fn check() -> Check {
    let fd = match sys::socket(libc::AF_NETLINK, libc::SOCK_RAW, nfq::NETLINK_NETFILTER) {
        Ok(fd) => fd,
        Err(e) => return Check::no(format!("no NETLINK_NETFILTER socket: {e}")),
    };
    match command(&fd, 1, nfq::NFQNL_CFG_CMD_BIND) {
        Ok(0) => {
            let _ = command(&fd, 2, nfq::NFQNL_CFG_CMD_UNBIND);
            let iptables = std::process::Command::new("iptables").arg("-V").output().is_ok();
            Check::yes(Some(if iptables {
                "queue bind works; iptables is installed for NFQUEUE rules".into()
            } else {
                "queue bind works; iptables is not installed (apt-get install iptables) to add NFQUEUE rules".into()
            }))
        }
        Ok(libc::EPERM) => Check::unchecked("binding a queue needs CAP_NET_ADMIN (run as root)"),
        Ok(libc::EBUSY) => Check::yes(Some(format!("queue {PROBE_QUEUE} is bound by another process"))),
        Ok(libc::ENOENT) | Ok(libc::EOPNOTSUPP) | Ok(libc::EPROTONOSUPPORT) => Check::no(
            "nfnetlink_queue is not available (modprobe nfnetlink_queue; CONFIG_NETFILTER_NETLINK_QUEUE)",
        ),
        Ok(e) => Check::no(format!("queue bind refused: {}", errno_name(e))),
        Err(e) => Check::no(format!("nfnetlink did not answer: {e}")),
    }
}
