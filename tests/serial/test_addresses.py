"""Where the ranks of an MPI launch reach rank 0's torch.distributed store
(``ringcomp.torch.addresses``), with and without a resolvable host name."""

from __future__ import annotations

import pytest

from ringcomp.torch import addresses


@pytest.fixture
def mine(monkeypatch):
    """This host's interfaces, as the test sets them."""
    interfaces = []
    monkeypatch.setattr(addresses, "ipv4_interfaces", lambda: interfaces)
    return interfaces


def test_rank0s_address_on_a_network_this_host_shares_wins(mine):
    mine += [("10.0.0.7", "255.255.255.0", "eth0"), ("10.77.0.2", "255.255.255.0", "eth1")]
    rank0 = {"resolved": "192.168.1.1",
             "interfaces": [("172.16.0.1", "255.255.0.0", "ib0"),
                            ("10.77.0.1", "255.255.255.0", "eth1")]}
    assert addresses.route_to(rank0) == ("10.77.0.1", "eth1")


def test_without_a_shared_network_the_resolved_name_then_the_first_interface(mine):
    mine += [("10.0.0.7", "255.255.255.0", "eth0")]
    elsewhere = [("172.16.0.1", "255.255.0.0", "ib0"), ("172.17.0.1", "255.255.0.0", "x")]
    assert addresses.route_to({"resolved": "192.168.1.1", "interfaces": elsewhere}) == \
        ("192.168.1.1", None)
    assert addresses.route_to({"resolved": None, "interfaces": elsewhere}) == \
        ("172.16.0.1", None)
    with pytest.raises(OSError, match="set MASTER_ADDR"):
        addresses.route_to({"resolved": None, "interfaces": []})


def test_one_node_is_loopback_and_this_hosts_interfaces_are_listed():
    assert addresses.route_to(None) == ("127.0.0.1", None)
    for addr, mask, name in addresses.ipv4_interfaces():  # this machine's, loopback left out
        assert not addr.startswith("127.") and mask.count(".") == 3 and name
    assert 0 < addresses.free_port() < 65536
