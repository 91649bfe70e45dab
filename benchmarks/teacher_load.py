"""A teacher server under hostile connections: its memory while they stall, after they go, and
how fast it sheds them.

Starts one `TeacherServer` (an MLP on 40 inputs, max_batch 4096, so an infer frame may announce
640 KiB) in its own process and measures its resident memory (VmRSS) at four moments:
  1. idle;
  2. with N authenticated connections that each announced a full batch and sent a tenth of it,
     then stalled;
  3. after the server's per-frame read timeout closed them all;
  4. with max_connections + extra unauthenticated idle connections: how many it refused at once.
Prints one table. Run: python benchmarks/teacher_load.py [--stalled 50] [--read-timeout 3]
"""

import argparse
import os
import select
import socket
import subprocess
import sys
import time

import torch

from lowband.distill import wire

SERVER = """
import sys, torch
from lowband.distill.teacher import TeacherServer
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(40, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
server = TeacherServer(model, (40,), 10, token="t0ken", max_batch=4096, read_timeout_s=float(sys.argv[1]),
                       idle_timeout_s=float(sys.argv[1]), max_connections=int(sys.argv[2]))
print(server.port, flush=True)
server.serve_forever()
"""


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def stalled(port: int, fraction: float) -> socket.socket:
    """An authenticated connection that announced a full batch, sent `fraction` of it, and stalls."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(wire.encode("hello", meta={"token": "t0ken"}))
    got = wire.recv(s, idle_s=10, frame_s=10)
    assert got is not None and got[0].kind == "ready", got
    frame = wire.encode("infer", 1, [torch.zeros(4096, 40)])
    s.sendall(frame[: int(len(frame) * fraction)])
    return s


def closed_by_server(s: socket.socket, wait_s: float) -> bool:
    s.settimeout(wait_s)
    try:
        while s.recv(65536):
            pass  # the error frame, then EOF
        return True
    except (TimeoutError, OSError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stalled", type=int, default=50)
    ap.add_argument("--read-timeout", type=float, default=3.0)
    ap.add_argument("--max-connections", type=int, default=64)
    ap.add_argument("--extra", type=int, default=16, help="idle connections past max_connections")
    args = ap.parse_args()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(args.read_timeout), str(args.max_connections)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        port = int(proc.stdout.readline())
        time.sleep(0.5)
        rows = [("idle", rss_kib(proc.pid), "")]
        t0 = time.monotonic()
        conns = [stalled(port, 0.1) for _ in range(args.stalled)]
        time.sleep(1.0)
        rows.append((f"{args.stalled} stalled (64 KiB sent of 640 KiB each)", rss_kib(proc.pid), ""))
        shed = sum(closed_by_server(s, args.read_timeout + 5) for s in conns)
        took = time.monotonic() - t0
        time.sleep(1.0)
        rows.append(("after the server closed them", rss_kib(proc.pid),
                     f"{shed}/{args.stalled} closed by the server, all within {took:.1f} s"))
        for s in conns:
            s.close()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10)
                for _ in range(args.max_connections + args.extra)]
        time.sleep(0.5)  # well inside the hello timeout: only the refused ones have an answer yet
        answered, _, _ = select.select(idle, [], [], 0)
        refused = sum(b"too many connections" in s.recv(4096) for s in answered)
        rows.append((f"{len(idle)} idle, no hello", rss_kib(proc.pid),
                     f"{refused} refused at once (max_connections {args.max_connections})"))
        for s in idle:
            s.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"teacher server memory (VmRSS), read timeout {args.read_timeout} s")
    print(f"{'moment':<44} {'RSS MiB':>8}  note")
    for moment, kib, note in rows:
        print(f"{moment:<44} {kib / 1024:>8.1f}  {note}")
    print(f"stalled connections held {(rows[1][1] - rows[0][1]) / args.stalled:.0f} KiB each; "
          f"{(rows[2][1] - rows[0][1]) / 1024:+.1f} MiB remained after they closed")


if __name__ == "__main__":
    main()
