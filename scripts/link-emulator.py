#!/usr/bin/python3
# The link of scripts/two-hosts.sh where the kernel has no netem (CONFIG_NET_SCH_NETEM):
# two TUN devices, one for each "host", and this process between them moving IP packets
# with netem's model: each packet waits for the link to be free (rate), then travels for
# the delay (plus a uniform jitter that never reorders), and is lost with a probability.
# The shaping is read from a file at start and again on SIGHUP. A device set down is a
# cut link: its packets go nowhere. Exits on SIGTERM; its devices go with it.
#
#   link-emulator.py TUN_A TUN_B SHAPE_FILE [SEED]
# SHAPE_FILE holds netem-style words: "delay 5ms 1ms rate 100mbit loss 1%" (or nothing).
import collections
import fcntl
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def seconds(word):
    for unit, scale in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if word.endswith(unit):
            return float(word[: -len(unit)]) * scale
    return float(word) * 1e-3  # tc's default unit for a bare number here: ms


def bits_per_second(word):
    w = word.lower()
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if w.endswith(unit):
            return float(w[: -len(unit)]) * scale
    raise ValueError("rate '%s': expected a number with gbit, mbit, kbit or bit" % word)


def parse_shape(text):
    shape = {"delay": 0.0, "jitter": 0.0, "rate": 0.0, "loss": 0.0}
    words = text.split()
    i = 0
    while i < len(words):
        w = words[i]
        if w == "delay":
            shape["delay"] = seconds(words[i + 1])
            i += 2
            if i < len(words) and words[i][0].isdigit():
                shape["jitter"] = seconds(words[i])
                i += 1
        elif w == "rate":
            shape["rate"] = bits_per_second(words[i + 1])
            i += 2
        elif w == "loss":
            shape["loss"] = float(words[i + 1].rstrip("%")) / 100.0
            i += 2
        else:
            raise ValueError("shape: unknown word '%s' in '%s'" % (w, text))
    return shape


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: link-emulator.py TUN_A TUN_B SHAPE_FILE [SEED]")
    name_a, name_b, shape_file = sys.argv[1:4]
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) == 5 else None)
    fds = [open_tun(name_a), open_tun(name_b)]
    shape = {}

    def reload(*_):
        try:
            with open(shape_file) as f:
                shape.update(parse_shape(f.read()))
        except (OSError, ValueError) as e:
            print("link-emulator: %s" % e, file=sys.stderr, flush=True)

    reload()
    signal.signal(signal.SIGHUP, reload)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Per direction (0: a to b, 1: b to a): packets in flight (release time, bytes), when
    # the link is free again, and the last release (jitter must not reorder).
    queues = [collections.deque(), collections.deque()]
    busy_until = [0.0, 0.0]
    last_release = [0.0, 0.0]
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        for d in (0, 1):
            q = queues[d]
            while q and q[0][0] <= now:
                _, packet = q.popleft()
                try:
                    os.write(fds[1 - d], packet)
                except OSError:
                    pass  # the other end is down: the packet is lost
        waits = [q[0][0] - now for q in queues if q]
        timeout = max(0.0, min(waits)) if waits else None
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for d in (0, 1):
            if fds[d] not in readable:
                continue
            for _ in range(64):
                try:
                    packet = os.read(fds[d], 65536)
                except (BlockingIOError, OSError):
                    break
                if shape["loss"] > 0 and rng.random() < shape["loss"]:
                    continue
                sent = now
                if shape["rate"] > 0:
                    sent = max(now, busy_until[d]) + len(packet) * 8 / shape["rate"]
                    busy_until[d] = sent
                release = sent + shape["delay"]
                if shape["jitter"] > 0:
                    release += rng.uniform(-shape["jitter"], shape["jitter"])
                release = max(release, last_release[d], now)
                last_release[d] = release
                queues[d].append((release, packet))


if __name__ == "__main__":
    main()
