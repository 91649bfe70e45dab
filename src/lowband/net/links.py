"""Slow links, two ways: modelled in the communicator, or real shaped network namespaces.

`--link RATE[,LATENCY]` (e.g. `10mbit,20ms`; rates in bit/kbit/mbit/gbit, decimal as in tc).

model  Every byte the communicator puts on the wire waits its turn on a per-link queue drained
       at RATE (a token bucket with no burst), plus LATENCY per message. Portable, no privileges.
       Collectives use one link (to the next rank on the ring); point-to-point calls one per peer.
       With sites (lowband.net.sites) a message crossing a site boundary takes the `--link` link,
       one inside a site the `link.intra` link (default unlimited: no delay); each class has its
       own queues.
netns  (root only) Every worker runs in its own network namespace, joined to the others through
       veth pairs and bridges, with `tc tbf` shaping both ends of each shaped veth; gloo is told to
       use that interface. Without sites each worker's own veth is shaped at RATE; with sites the
       workers of a site share a bridge (their veths shaped at `link.intra`, when limited) and the
       site one uplink shaped at RATE (`NetnsLinks`). tbf cannot delay, so LATENCY is refused here.
       Everything created is deleted when the run ends, fails or is interrupted.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from lowband import procs
from lowband.errors import ConfigError, UsageError

RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*$", re.I)
DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*$", re.I)
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class LinkSpec:
    rate_bps: float  # bits per second; inf: unlimited
    latency_s: float = 0.0

    @property
    def limited(self) -> bool:
        return self.rate_bps != float("inf") or self.latency_s > 0

    def describe(self) -> str:
        if not self.limited:
            return "unlimited"
        rate = "unlimited" if self.rate_bps == float("inf") else f"{self.rate_bps / 1e6:g} mbit/s"
        return rate + (f", {self.latency_s * 1e3:g} ms latency" if self.latency_s else "")

    def wire_seconds(self, nbytes: float) -> float:
        """Seconds `nbytes` occupy this link (0 when unlimited); the modelled link queues exactly this."""
        return nbytes * 8 / self.rate_bps

    def seconds(self, nbytes: float, messages: float = 1) -> float:
        """Seconds to send `nbytes` as `messages` blocking messages one after another: wire time plus
        one latency per message, as `LinkModel` charges them (used to project runs onto other links)."""
        return self.wire_seconds(nbytes) + messages * self.latency_s


LINK_WORDS = ("RATE[,LATENCY] such as 10mbit,20ms (rate units bit, kbit, mbit, gbit; latency units us, ms, s) "
              "or 'unlimited'")


def parse_link(text: str, field: str = "--link") -> LinkSpec:
    """'10mbit,20ms' -> LinkSpec(10e6, 0.02); '' or 'unlimited' -> no limit; else ConfigError naming `field`."""
    if not text or text.strip().lower() == "unlimited":
        return LinkSpec(float("inf"))
    rate_text, _, delay_text = text.partition(",")
    rate = RATE.match(rate_text)
    delay = DELAY.match(delay_text) if delay_text else None
    if not rate or (delay_text and not delay) or float(rate.group(1)) <= 0:
        raise ConfigError(field, text, f"must be {LINK_WORDS}")
    latency = float(delay.group(1)) * DELAY_UNITS[delay.group(2).lower()] if delay else 0.0
    return LinkSpec(float(rate.group(1)) * RATE_UNITS[rate.group(2).lower()], latency)


UNLIMITED = LinkSpec(float("inf"))


class LinkModel:
    """Per-link queues: bytes sent on a link are on the wire until the link has drained them.
    `spec` is the link between sites, `intra` the link inside a site."""

    def __init__(self, spec: LinkSpec, intra: LinkSpec = UNLIMITED):
        self.spec, self.intra = spec, intra
        self.free_at: dict = defaultdict(float)
        self.lock = threading.Lock()

    def reserve(self, link, nbytes: float, inter: bool = True, pipelined: bool = False) -> float:
        """Queue `nbytes` on `link` of the inter-site (or intra-site) class; returns the monotonic time
        at which they have arrived (0: an unlimited link, nothing to wait for). `pipelined`: part of a
        stream kept in flight (EDL-Dist's requests to teachers), whose latency overlaps; only the rate counts."""
        spec, key = (self.spec, link) if inter else (self.intra, ("intra", link))
        if not spec.limited:
            return 0.0
        with self.lock:
            start = max(time.monotonic(), self.free_at[key])
            done = start + spec.wire_seconds(nbytes)
            self.free_at[key] = done
        return done + (0.0 if pipelined else spec.latency_s)

    @staticmethod
    def wait_until(t: float) -> None:
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)


# ---- real shaped links: network namespaces -------------------------------------------------------
def _run(*cmd: str) -> None:
    procs.run(cmd, check=True, capture_output=True, text=True)


def check_netns_possible(spec: LinkSpec, field: str = "--link") -> None:
    if os.geteuid() != 0:
        raise UsageError("--link-mode netns needs root (it creates network namespaces); run as root or use --link-mode model")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UsageError(f"--link-mode netns needs {' and '.join(missing)} (Debian: apt-get install iproute2)")
    if spec.latency_s:
        raise UsageError(f"{field}: --link-mode netns shapes the rate with tc tbf, which cannot add latency; "
                         "drop the latency or use --link-mode model")


class NetnsLinks:
    """K namespaces lb<id>r<rank>, each with eth0 on 10.213.N.<rank+1>/24, joined through bridges.

    A worker alone in its site (the default: no site map) hangs off the core bridge lbbr<id> by a
    veth shaped both ways at the inter-site rate. The workers of a larger site share a site bridge
    lbs<id>s<site> (their veths shaped at `intra`'s rate when it is limited), and the site reaches
    the core bridge through one uplink veth pair lbu<id>s<site> / lbc<id>s<site> shaped both ways
    at the inter-site rate: the site's workers share its uplink, as a site's WAN link is shared."""

    def __init__(self, world: int, spec: LinkSpec, site_of: list[int] | None = None, intra: LinkSpec = UNLIMITED):
        check_netns_possible(spec)
        check_netns_possible(intra, "link.intra")
        self.world, self.spec, self.intra = world, spec, intra
        self.site_of = list(site_of) if site_of is not None else list(range(world))
        self.id = uuid.uuid4().hex[:6]
        self.subnet = 10 + int(self.id, 16) % 240
        self.bridge = f"lbbr{self.id}"
        self.created: list[tuple[str, str]] = []  # ("netns" | "link", name), deleted in reverse

    def namespace(self, rank: int) -> str:
        return f"lb{self.id}r{rank}"

    def address(self, rank: int) -> str:
        return f"10.213.{self.subnet}.{rank + 1}"

    def __enter__(self) -> NetnsLinks:
        try:
            self._bridge(self.bridge)
            for site in sorted(set(self.site_of)):
                members = [r for r, s in enumerate(self.site_of) if s == site]
                if len(members) == 1:
                    self._add_worker(members[0], self.bridge, self.spec)
                    continue
                local = self._uplink(site)
                for rank in members:
                    self._add_worker(rank, local, self.intra)
        except BaseException:
            self.close()
            raise
        return self

    def _bridge(self, name: str) -> None:
        _run("ip", "link", "add", name, "type", "bridge")
        self.created.append(("link", name))
        _run("ip", "link", "set", name, "up")

    def _uplink(self, site: int) -> str:
        """The site's bridge, joined to the core bridge by a veth pair shaped at the inter-site rate."""
        local, up, core = f"lbs{self.id}s{site}", f"lbu{self.id}s{site}", f"lbc{self.id}s{site}"
        self._bridge(local)
        _run("ip", "link", "add", up, "type", "veth", "peer", "name", core)
        self.created.append(("link", up))
        _run("ip", "link", "set", up, "master", local, "up")
        _run("ip", "link", "set", core, "master", self.bridge, "up")
        if self.spec.rate_bps != float("inf"):
            self._shape(["tc"], up, self.spec)
            self._shape(["tc"], core, self.spec)
        return local

    def _add_worker(self, rank: int, bridge: str, spec: LinkSpec) -> None:
        ns, host = self.namespace(rank), f"lbv{self.id}r{rank}"
        _run("ip", "netns", "add", ns)
        self.created.append(("netns", ns))
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.created.append(("link", host))
        _run("ip", "link", "set", host, "master", bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.address(rank)}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        # a collective's bursts are separated by short idle gaps: do not restart TCP slow start after each
        _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0")
        if spec.rate_bps != float("inf"):
            self._shape(["ip", "netns", "exec", ns, "tc"], "eth0", spec)
            self._shape(["tc"], host, spec)

    @staticmethod
    def _shape(tc: list[str], dev: str, spec: LinkSpec) -> None:
        """tbf at RATE with a short queue and a 50 ms burst. A deep queue (500 ms) kept the ACKs of the
        opposite direction behind data, and a 10 ms burst starved them of tokens: either made a two-way
        all-reduce 15-30% slower than the link allows; with these settings it is within ~7% (framing)."""
        rate = int(spec.rate_bps)
        burst = max(int(spec.rate_bps / 8 / 20), 4096)  # 50 ms of traffic
        _run(*tc, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate}bit", "burst", f"{burst}b",
             "latency", "20ms")

    def prefix(self, rank: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(rank)]

    def env(self, rank: int) -> dict:
        return {"GLOO_SOCKET_IFNAME": "eth0"}

    def close(self) -> None:
        for kind, name in reversed(self.created):
            cmd = ("ip", "netns", "del", name) if kind == "netns" else ("ip", "link", "del", name)
            procs.run(cmd, capture_output=True)  # a veth is gone with its namespace: ignore errors
        self.created.clear()

    def __exit__(self, *exc) -> None:
        self.close()


def leftover_namespaces() -> list[str]:
    out = procs.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if re.match(r"lb[0-9a-f]{6}r\d+", line)]
