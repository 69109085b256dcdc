"""A lossy, slow link in user space, where the kernel has no netem: a TUN device in each
of two network namespaces, and this process passing IP packets between them, each way
with its own delay and loss (``tc netem delay D loss L`` on that side's egress).

    python netrelay.py NS_A DEV_A NS_B DEV_B

prints ``ready`` once both devices exist (the caller gives them addresses and sets them
up), then reads commands on stdin, one a line: ``a2b DELAY_S LOSS`` or ``b2a DELAY_S
LOSS`` (LOSS from 0 to 1; 1 is a cut), and says ``ok`` to each. Stdin closed: it exits.
Counts of packets passed and dropped go to stderr at exit.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import os
import random
import select
import struct
import sys
import threading
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def open_tun(ns: str, name: str) -> int:
    """A TUN device named ``name`` in namespace ``ns``; the fd stays bound to it."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        _setns(target)
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    finally:
        _setns(home)
        os.close(target)
        os.close(home)
    return fd


def main() -> None:
    ns_a, dev_a, ns_b, dev_b = sys.argv[1:5]
    fds = {"a2b": (open_tun(ns_a, dev_a), open_tun(ns_b, dev_b))}
    fds["b2a"] = (fds["a2b"][1], fds["a2b"][0])
    shape = {"a2b": (0.0, 0.0), "b2a": (0.0, 0.0)}
    counts = {"passed": 0, "dropped": 0}
    due: list[tuple[float, int, int, bytes]] = []  # (when, seq, fd, packet)
    lock = threading.Lock()
    stop = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            way, delay, loss = line.split()
            with lock:
                shape[way] = (float(delay), float(loss))
            print("ok", flush=True)
        stop.set()

    threading.Thread(target=commands, daemon=True).start()
    print("ready", flush=True)
    by_src = {fds[w][0]: w for w in fds}
    poller = select.poll()  # not select(), which refuses a descriptor past 1023
    for src in by_src:
        poller.register(src, select.POLLIN)
    seq = 0
    while not stop.is_set():
        wait = max(0.0, min(0.05, due[0][0] - time.monotonic())) if due else 0.05
        for src, _ in poller.poll(wait * 1000):
            way = by_src[src]
            packet = os.read(src, 65536)
            with lock:
                delay, loss = shape[way]
            if random.random() < loss:
                counts["dropped"] += 1
                continue
            seq += 1
            heapq.heappush(due, (time.monotonic() + delay, seq, fds[way][1], packet))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, dst, packet = heapq.heappop(due)
            try:
                os.write(dst, packet)
                counts["passed"] += 1
            except OSError:
                counts["dropped"] += 1
    print(f"passed {counts['passed']} dropped {counts['dropped']}", file=sys.stderr)


if __name__ == "__main__":
    main()
