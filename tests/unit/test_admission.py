"""Admission: pending sockets are bounded, the oldest is evicted, revoked admins are found."""

from swamp.orchestrator.admin_auth import Principal
from swamp.orchestrator.admission import Admission


class Conn:
    def __init__(self, name):
        self.name = name


def test_past_the_cap_the_oldest_pending_socket_is_evicted():
    admission = Admission(max_pending=3)
    conns = [Conn(i) for i in range(5)]
    assert [admission.arrived(c) for c in conns[:3]] == [None, None, None]
    admission.trusted(conns[0])  # enrolled: no longer pending, never evicted
    assert admission.arrived(conns[3]) is None
    assert admission.arrived(conns[4]) is conns[1]
    assert not admission.is_pending(conns[1]) and admission.is_pending(conns[4])
    assert admission.statistics()["pending"] == 3 and admission.evicted == 1
    admission.left(conns[2])
    assert admission.statistics()["pending"] == 2


def test_a_socket_whose_enrollment_is_being_decided_is_never_evicted():
    admission = Admission(max_pending=2)
    first, second, third, fourth = (Conn(i) for i in range(4))
    admission.arrived(first)
    admission.arrived(second)
    admission.engaged(first, True)
    assert admission.arrived(third) is second
    admission.engaged(third, True)
    assert admission.arrived(fourth) is None  # everyone older is enrolling: over the cap, briefly
    admission.engaged(first, False)
    assert admission.arrived(Conn(5)) is first


def test_revoked_admins_are_checked_once_per_principal():
    admission = Admission()
    ops, ci, local = (
        Principal("server-token", "ops"),
        Principal("server-token", "ci"),
        Principal("local", "local"),
    )
    conns = {Conn(i): p for i, p in enumerate([ops, ops, ci, local])}
    for conn, principal in conns.items():
        admission.arrived(conn)
        admission.trusted(conn, principal)
    asked = []

    def still_valid(principal):
        asked.append(principal)
        return principal.name != "ops"

    revoked = admission.revoked_admins(still_valid)
    assert sorted(c.name for c in revoked) == [0, 1]
    assert asked.count(ops) == 1
