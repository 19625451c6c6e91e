"""The process tree's one definition (keeper.py's `closure`), which the keeper and the daemon's
stop (treestop.py, with its keeper lost) both take: on process tables written out, no /proc.
The behaviour on real processes is tested in test_keeper_two_faults.py and test_keeper_lost.py.
"""

from __future__ import annotations

from elector.daemon.execmode.keeper import closure

#: (pid, ppid, pgid, sid) of a keeper (100), its command's group and session, and strangers.
KEEPER = (100, 1, 100, 100)
COMMAND = (101, 100, 100, 100)
#: A chain that left the session one level at a time while each parent still lives.
ESCAPED = (102, 101, 102, 102)
ESCAPED_CHILD = (103, 102, 103, 103)
ESCAPED_GRANDCHILD = (104, 103, 104, 104)
#: Reparented to init, but still a member of a group that an escaped process leads.
ORPHAN_IN_ESCAPED_GROUP = (105, 1, 102, 102)
#: Somebody else's processes, one of them in a session of their own led by init's child.
STRANGER = (200, 1, 200, 200)
STRANGERS_CHILD = (201, 200, 200, 200)

TABLE = [
    KEEPER,
    COMMAND,
    ESCAPED,
    ESCAPED_CHILD,
    ESCAPED_GRANDCHILD,
    ORPHAN_IN_ESCAPED_GROUP,
    STRANGER,
    STRANGERS_CHILD,
]


def test_a_chain_that_left_the_session_is_found_whole_in_one_snapshot() -> None:
    assert closure([100], TABLE) == {100, 101, 102, 103, 104, 105}


def test_the_members_of_a_group_or_session_a_member_leads_belong_to_the_tree() -> None:
    assert 105 in closure([102], TABLE)
    assert closure([105], TABLE) == {105}, "a member leads nothing: only itself"


def test_the_roots_are_in_it_and_strangers_are_not() -> None:
    assert closure([101, 200], TABLE) == {101, 102, 103, 104, 105, 200, 201}
    assert closure([300], TABLE) == {300}
    assert closure([], TABLE) == set()


def test_a_cycle_of_ids_ends() -> None:
    """A table read while pids are reused can hold a process that seems to lead its own parent."""
    assert closure([1], [(1, 2, 1, 1), (2, 1, 2, 2)]) == {1, 2}
