"""An emulated cluster on one machine: network namespaces, a bridge, rate-limited links.

Layout (all inside namespaces this module creates; nothing touches the machine's own
network): a switch namespace holding a bridge, and per emulated host h a namespace whose
``eth1`` is one end of a veth pair; the other end (``sw<h>``) is a port of the bridge. A
token-bucket filter (tc tbf) on both ends limits the host's link in both directions.
Hosts get 10.77.0.<h>/24 and their own hostname (a UTS namespace per launched process),
so MPI sees separate nodes: TCP between hosts, shared memory inside one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field

SUBNET = "10.77.0"
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
PROBE_PORT = 7077  # the reachability check's TCP port, inside the namespaces only
PROBE_SECONDS = 15

# one TCP exchange: the listener answers the first connection with b"ok"
_LISTEN = ("import socket; s = socket.create_server(({addr!r}, {port})); s.settimeout({t}); "
           "c, _ = s.accept(); c.sendall(b'ok'); c.close()")
_CONNECT = """
import socket, sys, time
deadline = time.time() + {t}
while True:  # the listener may not be up yet
    try:
        with socket.create_connection(({addr!r}, {port}), timeout=2) as c:
            sys.exit(0 if c.recv(2) == b"ok" else 1)
    except OSError:
        if time.time() > deadline:
            sys.exit(1)
        time.sleep(0.1)
"""


class TestbedError(RuntimeError):
    """The testbed cannot be built here (not root, no namespaces, no tc)."""

    __test__ = False  # not a pytest class, whatever its name


def system_path() -> str:
    """PATH with the sbin directories appended: ip and tc live there, and a root shell
    from ``env -i``, cron or a CI runner may not list them."""
    parts = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(parts + [d for d in SBIN if d not in parts])


def tool_env() -> dict:
    """This process's environment with ``system_path()``: for every command run here."""
    return {**os.environ, "PATH": system_path()}


def _run(*args: str) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=30,
                         env=tool_env())
    if out.returncode != 0:
        raise TestbedError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def check_available() -> None:
    """Raise TestbedError with the reason when namespaces and tc cannot be used here."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (network namespaces and tc): run it as "
                           "root or with sudo")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool, path=system_path()) is None:
            raise TestbedError(f"the testbed needs '{tool}' (apt-get install iproute2 "
                               f"util-linux)")


def tbf_burst(rate_bps: float) -> int:
    """Bucket size: 4 ms at the rate (a 250 Hz tick; measured: 1 ms cost 20% of the
    throughput at 10 Gbit/s), at least 64 KB (one GSO segment). Messages within the bucket
    pass at memory speed, so the testbed is optimistic below about 4 ms of line rate."""
    return max(64 << 10, int(rate_bps / 8 / 250))


@dataclass
class Testbed:
    """``hosts`` emulated hosts, each on a link of ``rate_bps`` both ways. A context
    manager: entering builds it (undoing what was built if a step fails), leaving always
    tears it down."""

    __test__ = False  # not a pytest class, whatever its name
    hosts: int
    rate_bps: float
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def __post_init__(self):
        if not 2 <= self.hosts <= 8:
            raise ValueError(f"hosts must be 2..8 (2 cores cannot drive more), got "
                             f"{self.hosts}")
        if not 1e6 <= self.rate_bps <= 100e9:
            raise ValueError(f"rate must be 1 Mbit/s..100 Gbit/s, got {self.rate_bps:g}")

    @property
    def switch(self) -> str:
        return f"rc{self.tag}sw"

    def namespace(self, host: int) -> str:
        """Namespace of host 1..hosts."""
        return f"rc{self.tag}h{host}"

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host}"

    def names(self) -> list[str]:
        return [self.switch] + [self.namespace(h) for h in range(1, self.hosts + 1)]

    def __enter__(self) -> Testbed:
        check_available()
        self.mark_owner()
        try:
            self._build()
            self.check_reachable()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _build(self) -> None:
        rate, burst = f"{int(self.rate_bps)}bit", str(tbf_burst(self.rate_bps))
        sw = self.switch
        _run("ip", "netns", "add", sw)
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        for h in range(1, self.hosts + 1):
            ns = self.namespace(h)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", "eth1", "netns", ns, "type", "veth", "peer", "name",
                 f"sw{h}", "netns", sw)
            _run("ip", "-n", sw, "link", "set", f"sw{h}", "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", "eth1")
            _run("ip", "-n", ns, "link", "set", "eth1", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            for where, dev in ((ns, "eth1"), (sw, f"sw{h}")):  # host's out, host's in
                _run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root",
                     "tbf", "rate", rate, "burst", burst, "latency", "50ms")

    def check_reachable(self, seconds: float = PROBE_SECONDS) -> None:
        """Raise TestbedError unless host 1 reaches every other host over TCP through the
        bridge: a sandbox that builds namespaces but forwards nothing gives a clear error
        here instead of an MPI job that hangs."""
        for h in range(2, self.hosts + 1):
            addr, t = self.address(h), seconds
            listener = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace(h), sys.executable, "-c",
                 _LISTEN.format(addr=addr, port=PROBE_PORT, t=t)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=tool_env())
            try:
                client = subprocess.run(
                    ["ip", "netns", "exec", self.namespace(1), sys.executable, "-c",
                     _CONNECT.format(addr=addr, port=PROBE_PORT, t=t)],
                    capture_output=True, text=True, timeout=t + 10, env=tool_env())
                ok = client.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            finally:
                listener.kill()
                _, err = listener.communicate()
            if not ok:
                raise TestbedError(f"host 1 cannot reach host {h} ({addr}) over TCP through "
                                   f"the bridge in {t} s: namespaces and veth work here but "
                                   f"do not forward traffic {err.strip()[-200:]}")

    def teardown(self) -> None:
        """Kill whatever still runs in the namespaces, then delete them (their links go
        with them), and remove the owner mark. Safe to call twice, and on a half-built
        testbed."""
        remove_namespaces(self.existing())
        with contextlib.suppress(FileNotFoundError):
            os.remove(owner_file(self.tag))

    def existing(self) -> list[str]:
        """The namespaces of this testbed that exist right now."""
        listed = set(list_namespaces())
        return [ns for ns in self.names() if ns in listed]

    def mark_owner(self) -> None:
        """Record which process owns this testbed, so a later one can tell the remains of
        a killed testbed (owner gone) from a testbed that is running now."""
        with open(owner_file(self.tag), "w") as f:
            f.write(str(os.getpid()))


    def sent_bytes(self) -> list[tuple[int, int]]:
        """Per host: (bytes it sent onto its link, bytes the switch sent to it), from the
        tbf qdisc counters."""
        def sent(ns, dev):
            text = _run("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev)
            match = re.search(r"Sent (\d+) bytes", text)
            return int(match.group(1)) if match else 0
        return [(sent(self.namespace(h), "eth1"), sent(self.switch, f"sw{h}"))
                for h in range(1, self.hosts + 1)]


# -- remains of testbeds whose process was killed (kill -9 skips every teardown) ----------
NAMESPACE = re.compile(r"^rc([0-9a-f]{6})(sw|h\d+)$")
TEMP_PREFIX = "ringcomp-testbed-"


def owner_file(tag: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"{TEMP_PREFIX}{tag}.owner")


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         env=tool_env()).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_namespaces(names) -> None:
    """Kill every process inside each namespace, then delete it."""
    for ns in names:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True, env=tool_env()).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, env=tool_env())


def _owner_alive(tag: str) -> bool:
    try:
        with open(owner_file(tag)) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def leftovers() -> list[str]:
    """Namespaces, temporary directories and owner marks of testbeds whose owning process
    is gone (a testbed that is running now is never listed)."""
    found = [ns for ns in list_namespaces()
             if (m := NAMESPACE.match(ns)) and not _owner_alive(m.group(1))]
    tmp = tempfile.gettempdir()
    for name in sorted(os.listdir(tmp)):
        m = re.match(rf"^{TEMP_PREFIX}([0-9a-f]{{6}})(\.owner|-.*)$", name)
        if m and not _owner_alive(m.group(1)):
            found.append(os.path.join(tmp, name))
    return found


def cleanup() -> list[str]:
    """Remove what ``leftovers()`` lists (processes in those namespaces included); returns
    what was removed."""
    found = leftovers()
    remove_namespaces([x for x in found if not os.path.isabs(x)])
    for path in (x for x in found if os.path.isabs(x)):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    return found
