"""Where rank 0 of an MPI launch can be reached over TCP: its port, and an address each rank
can route to, with or without a resolvable host name."""

from __future__ import annotations

import ipaddress
import socket
import sys

#: Linux's ioctl requests for an interface's IPv4 address and netmask (netdevice(7))
SIOCGIFADDR, SIOCGIFNETMASK = 0x8915, 0x891B


def ipv4_interfaces() -> list[tuple[str, str, str]]:
    """This host's IPv4 interfaces but loopback, as (address, netmask, name); empty where
    they cannot be listed (not Linux)."""
    if not sys.platform.startswith("linux"):
        return []
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                addr, mask = (socket.inet_ntoa(fcntl.ioctl(s.fileno(), kind, request)[20:24])
                              for kind in (SIOCGIFADDR, SIOCGIFNETMASK))
            except OSError:  # an interface without an IPv4 address
                continue
            if not ipaddress.ip_address(addr).is_loopback:
                found.append((addr, mask, name))
    return found


def resolved_host() -> str | None:
    """This host's name resolved to an address other than loopback, or None (a name no
    resolver knows: containers, emulated hosts; or one that names 127.0.1.1)."""
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if ipaddress.ip_address(addr).is_loopback else addr


def route_to(candidates: dict | None) -> tuple[str, str | None]:
    """Of rank 0's ``candidates`` (``{"resolved": address or None, "interfaces":
    ipv4_interfaces()}``), the address this host reaches it by, and the name of this
    host's interface on that network (None where none was found): one on a network this
    host has an interface on (the interface MPI's own traffic most likely takes), else
    the address rank 0's name resolves to, else its first interface's; 127.0.0.1 on one
    node (``candidates`` None)."""
    if candidates is None:
        return "127.0.0.1", None
    mine = [(ipaddress.ip_interface(f"{a}/{m}").network, name)
            for a, m, name in ipv4_interfaces()]
    for addr, *_ in candidates["interfaces"]:
        for network, name in mine:
            if ipaddress.ip_address(addr) in network:
                return addr, name
    if candidates["resolved"]:
        return candidates["resolved"], None
    if candidates["interfaces"]:
        return candidates["interfaces"][0][0], None
    raise OSError("rank 0's host has no IPv4 address other than loopback and a name no "
                  "resolver knows: set MASTER_ADDR to an address of it the ranks reach")


def free_port() -> int:
    """A TCP port free on this host now (the store binds it right after)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
