"""NfLog and CtEvents: the frame ring's other netlink users, from Python."""

import asyncio
import socket
import struct
import time

import zcio


def test_nflog_reads_logged_packets_with_prefix_and_no_loss(host, udp):
    host.iptables("-A", "INPUT", "-p", "udp", "--dport", "9999", "-j", "NFLOG",
                  "--nflog-group", "5", "--nflog-prefix", "zcio: ")
    with zcio.NfLog(5) as log:
        udp.send(*(struct.pack(">I", i) + b"x" * 60 for i in range(20)))
        got = []
        end = time.time() + 3
        while len(got) < 20 and time.time() < end:
            got.extend(log.next_batch(0.1))
        assert len(got) == 20
        assert all(e.prefix == "zcio: " and e.group == 5 and e.hook == 1 for e in got)
        assert [struct.unpack(">I", e.payload[28:32])[0] for e in got] == list(range(20))
        assert [e.seq for e in got] == list(range(got[0].seq, got[0].seq + 20))
        st = log.stats
        assert st["packets"] == 20 and st["lost"] == 0 and not st["any_loss"]
    assert len(udp.wait_for(20)) == 20, "NFLOG only logs: the packets went on"


def test_nflog_under_asyncio(host, udp):
    host.iptables("-A", "INPUT", "-p", "udp", "--dport", "9999", "-j", "NFLOG", "--nflog-group", "6")

    async def main(log):
        n = 0
        async for e in log:
            n += 1
            if n == 10:
                return n

    with zcio.NfLog(6) as log:
        loop = asyncio.new_event_loop()
        try:
            loop.call_later(0.05, lambda: udp.send(*(b"y" * 40 for _ in range(10))))
            assert loop.run_until_complete(asyncio.wait_for(main(log), 5)) == 10
        finally:
            loop.close()


def test_conntrack_events_show_a_udp_flow_as_conntrack_prints_it(host, udp):
    # A rule that uses conntrack makes the namespace track connections.
    host.iptables("-A", "INPUT", "-m", "conntrack", "--ctstate", "NEW,ESTABLISHED", "-j", "ACCEPT")
    with zcio.CtEvents(update=False) as ev:
        udp.send(b"hello")
        got = []
        end = time.time() + 3
        while not any(e.kind == "new" for e in got) and time.time() < end:
            got.extend(ev.next_batch(0.1))
        new = [e for e in got if e.kind == "new" and e.orig and e.orig["dport"] == 9999]
        assert new, [e.line for e in got]
        e = new[0]
        assert e.orig["proto"] == 17 and e.orig["dst"] == "127.0.0.1"
        assert e.line.strip().startswith("[NEW] udp"), e.line
        assert "dport=9999" in e.line
        assert ev.stats["new"] >= 1 and ev.stats["lost"] == 0


def test_nflog_loss_after_the_last_packet_is_a_lower_bound_not_zero(host, udp):
    # Nothing is read while a whole burst is logged, and nothing is logged after it: no
    # sequence gap can show the loss, so the stats give a bound from the batches the socket
    # dropped.
    host.iptables("-A", "INPUT", "-p", "udp", "--dport", "9999", "-j", "NFLOG", "--nflog-group", "7")
    with zcio.NfLog(7, sock_len=64 << 10, qthresh=8) as log:
        sent = 4000
        udp.send(*(struct.pack(">I", i) + b"z" * 196 for i in range(sent)))
        time.sleep(0.1)  # past the kernel's flush timer: the last partial batch is dropped too
        got = []
        while True:
            b = log.next_batch(0.2)
            if not b:
                break
            got.extend(b)
        st = log.stats
    missing = sent - len(got)
    assert missing > 0, st
    assert st["tail_batches"] > 0 and not st["lost_exact"], st
    assert 0 < st["lost_at_least"] <= missing <= st["lost_at_most"], st
    assert f"lost >= {st['lost_at_least']}" in st["loss_summary"], st["loss_summary"]


def test_conntrack_loss_is_exact_when_nothing_was_dropped(host, udp):
    host.iptables("-A", "INPUT", "-m", "conntrack", "--ctstate", "NEW,ESTABLISHED", "-j", "ACCEPT")
    with zcio.CtEvents(update=False) as ev:
        udp.send(b"hello")
        end = time.time() + 3
        while not ev.next_batch(0.1) and time.time() < end:
            pass
        st = ev.stats
    assert st["lost_exact"] and st["lost_at_least"] == 0 and st["lost_at_most"] == 0, st
    assert st["loss_summary"].startswith("no loss"), st
