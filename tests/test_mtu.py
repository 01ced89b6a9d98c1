"""A link whose MTU is below K's largest frame is refused in one line, by the switch's ports and the
hosts' sockets alike: the kernel would drop such frames without a word."""
import pytest

from host_agent import rawsock
from mindp import protocol as P
from mindp.netutil import mtu_problem
from mindp.harness import testbed
from mindp.harness.testbed import sh
from mindp.topology import Host
from softswitch.ports import Port, PortError

needs_big_frames = pytest.mark.skipif(P.required_mtu() <= 1500, reason=f"K = {P.K}: every frame fits a 1500 MTU")


def test_link_mtu_fits_every_frame_of_k():
    for k in (8, 32, 512, 1024, P.MAX_K):
        assert P.link_mtu(k) >= P.frame_len(P.Kind.SUM, k) - P.ETH_LEN >= P.frame_len(P.Kind.GRAD, k) - P.ETH_LEN
        assert P.link_mtu(k) >= 1500


@needs_big_frames
def test_a_port_and_a_host_socket_on_a_small_mtu_are_refused_in_one_line():
    with testbed.Testbed("mtu") as bed:
        nh = bed.add(Host("a", "02:00:00:00:09:01", "10.0.9.1", 1))
        assert mtu_problem(nh.switch_iface) is None  # the testbed fits its links to K
        sh("ip", "link", "set", nh.switch_iface, "mtu", "1500")
        why = mtu_problem(nh.switch_iface)
        assert why and "\n" not in why and f"K = {P.K}" in why and "1500" in why
        with pytest.raises(PortError, match="MTU 1500 is below"):
            Port(1, nh.switch_iface)
        with pytest.raises(rawsock.SocketError, match="MTU 1500 is below"):
            rawsock.open_raw(nh.switch_iface)
