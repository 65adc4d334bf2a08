"""The consumer side of `zcio bench python`: binds NFQUEUE queue QUEUE with one library, prints
"ready", waits for "go" on stdin (the suite has filled the kernel queue meanwhile), decides COUNT
packets and prints one JSON line: the process's CPU seconds (user + system, every thread, from
"ready" on: fnfqueue's reader thread starts receiving before "go"), the wall time from "go" to
the last verdict, and the packets handled.

    nfq_consumer.py MODE QUEUE COUNT CPU PARSE

MODE: netfilterqueue | fnfqueue | zcio-callback (zcio.NetfilterQueue, the same code as the
netfilterqueue mode) | zcio-batch (zcio.NfQueue.batches). PARSE: "scapy" parses every packet
with scapy and drops UDP to port 1 (none in the flood), "none" accepts without looking.
"""

import json
import os
import resource
import socket
import sys
import time

mode, queue, count, cpu, parse = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# Receive buffer asked for on every side (the kernel doubles it): room for the pre-filled queue.
SOCK_LEN = 48 << 20
MAX_LEN = count + 4096
SO_RCVBUFFORCE = 33

os.sched_setaffinity(0, {cpu})

if parse == "scapy":
    from scapy.layers.inet import IP, UDP

    def keep(payload) -> bool:
        pkt = IP(payload)
        return not (UDP in pkt and pkt[UDP].dport == 1)
else:
    keep = None


class Done(Exception):
    pass


def cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


handled = 0
extra = {}

if mode in ("netfilterqueue", "zcio-callback"):
    if mode == "netfilterqueue":
        from netfilterqueue import NetfilterQueue
    else:
        from zcio import NetfilterQueue

    if keep is None:
        def cb(p):
            global handled
            p.accept()
            handled += 1
            if handled >= count:
                raise Done
    else:
        def cb(p):
            global handled
            if keep(p.get_payload()):
                p.accept()
            else:
                p.drop()
            handled += 1
            if handled >= count:
                raise Done

    q = NetfilterQueue()
    q.bind(queue, cb, max_len=MAX_LEN, sock_len=SOCK_LEN)

    def consume():
        try:
            q.run()
        except Done:
            pass

    def finish():
        if mode == "zcio-callback":
            extra["path"] = q._q.path
            st = q.stats
            extra["syscalls"] = st["recv_syscalls"] + st["send_syscalls"]
        q.unbind()

elif mode == "zcio-batch":
    import zcio

    # A copy range whose datagrams always fit a 4 KiB frame (4080 payload bytes - 512 for the
    # netlink headers), so frames are filled by io_uring (netfilterqueue itself caps its copy
    # range at 4016 bytes).
    q = zcio.NfQueue(queue, max_len=MAX_LEN, sock_len=SOCK_LEN, copy_range=3568)

    def consume():
        global handled
        for batch in q.batches(max=64):
            if keep is not None:
                for p in batch:
                    if not keep(bytes(p.payload)):
                        p.drop()
            handled += batch.accept() if keep is None else len(batch)
            if keep is not None:
                batch.accept()
            if handled >= count:
                break

    def finish():
        extra["path"] = q.path
        st = q.stats
        extra["syscalls"] = st["recv_syscalls"] + st["send_syscalls"]
        q.close()

elif mode == "fnfqueue":
    import fnfqueue

    conn = fnfqueue.Connection()
    fq = conn.bind(queue)
    fq.set_mode(0xFFFF, fnfqueue.COPY_PACKET)
    fq.set_maxlen(MAX_LEN)
    # fnfqueue has no receive-buffer setting; the same as the others, on its socket.
    with socket.fromfd(conn._conn.fd, socket.AF_NETLINK, socket.SOCK_RAW) as s:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, SOCK_LEN)

    def consume():
        global handled
        for p in conn:
            if keep is None or keep(p.payload):
                p.accept()
            else:
                p.drop()
            handled += 1
            if handled >= count:
                break

    def finish():
        fq.unbind()
        conn.close()

else:
    sys.exit(f"unknown mode {mode}")

print("ready", flush=True)
c0 = cpu_now()
if sys.stdin.readline().strip() != "go":
    sys.exit("no go")
t0 = time.perf_counter()
consume()
wall = time.perf_counter() - t0
cpu_s = cpu_now() - c0
finish()
print(json.dumps({"cpu": cpu_s, "wall": wall, "handled": handled, **extra}), flush=True)
