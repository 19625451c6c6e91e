"""How an HTTP attack's figures are judged: what counts as the attack's loss (pure, no processes)."""

from __future__ import annotations

from tests.faults.http_measure import Figures, longest_gap_window, renewal_gaps

ATTACKER = {"connections": 4}


def figures(
    *, gaps_s: list[float], others_redis_stalls: int, lost: bool = True, machine_lateness_s: float = 0.6
) -> Figures:
    # The request timeout (1 s) is above the default lateness: only the control group can excuse.
    return Figures(
        attack="pipeline_noread", seconds=10.0, gap_bound_s=0.9, request_timeout_s=1.0, gaps_s=gaps_s,
        lease_writes=["DEL@+7.22s", "SET@+7.24s"] if lost else [], step_downs=int(lost),
        takeovers=int(lost), machine_lateness_s=machine_lateness_s,
        others_redis_stalls=others_redis_stalls, attacker=ATTACKER,
    )  # fmt: skip


def test_a_loss_while_the_daemons_not_attacked_also_timed_out_is_the_machines() -> None:
    # Gaps within 0.9 s + 2 x 0.6 s of measured lateness, and the control group stalled too.
    judged = figures(gaps_s=[0.6, 1.65], others_redis_stalls=2)
    assert judged.load_explains_loss
    assert judged.lease_problems() == []


def test_a_loss_while_the_others_got_answers_is_the_attacks() -> None:
    judged = figures(gaps_s=[0.6, 1.65], others_redis_stalls=0)
    assert not judged.load_explains_loss
    assert judged.lease_problems() == [
        "2 lease(s) lost: ['DEL@+7.22s', 'SET@+7.24s']",
        "1 step-down(s), 1 takeover(s)",
    ]


def test_a_gap_beyond_the_lateness_bound_is_the_attacks_even_if_the_others_stalled() -> None:
    judged = figures(gaps_s=[0.6, 2.5], others_redis_stalls=3)
    assert not judged.load_explains_loss
    problems = judged.lease_problems()
    assert problems[0].startswith("2 lease(s) lost") and problems[-1].startswith("renewal gap 2.500s")


def test_an_attack_that_never_connected_proves_nothing_whatever_the_others_saw() -> None:
    judged = figures(gaps_s=[0.6], others_redis_stalls=1, lost=False)
    judged.attacker = {"connections": 0}
    assert judged.lease_problems() == [f"the attacker never connected: {judged.attacker}"]


def test_a_loss_while_this_process_stalled_a_whole_request_timeout_is_the_machines() -> None:
    # Run #11's short_connections: the followers asked Redis nothing in those seconds, but a
    # timer here woke later than the leader's request timeout, and the gaps stayed in bound.
    judged = figures(gaps_s=[0.6, 1.26], others_redis_stalls=0, machine_lateness_s=1.0)
    assert judged.loss_excuse is not None and "woke 1.000s late" in judged.loss_excuse
    assert judged.lease_problems() == []


def test_a_stall_shorter_than_the_request_timeout_excuses_nothing() -> None:
    judged = figures(gaps_s=[0.6, 1.26], others_redis_stalls=0, machine_lateness_s=0.99)
    assert judged.loss_excuse is None
    assert judged.lease_problems()[0].startswith("2 lease(s) lost")


def test_a_gap_beyond_the_lateness_bound_is_the_attacks_however_late_this_process_woke() -> None:
    judged = figures(gaps_s=[0.6, 3.0], others_redis_stalls=0, machine_lateness_s=1.0)
    assert judged.loss_excuse is None
    assert judged.lease_problems()[-1].startswith("renewal gap 3.000s")


def test_the_gaps_end_with_the_leaders_term_not_at_the_next_holders_first_renewal() -> None:
    # Run #14's soak 8: the leader's last renewal at 4.0, its release at 5.35, the next holder's
    # grant at once and its first renewal one renew interval later (6.0). The takeover is not a
    # gap between the leader's renewals.
    renewals = [1.0, 1.6, 2.2, 2.8, 3.4, 4.0, 6.0, 6.6]
    count, gaps = renewal_gaps(renewals, began=1.2, ended=11.2, term_ended=5.35, now=12.0)
    assert count == 5 and [round(gap, 3) for gap in gaps] == [0.6, 0.6, 0.6, 0.6, 0.6, 1.35]


def test_without_a_lost_term_the_gaps_run_to_the_first_renewal_after_the_attack() -> None:
    renewals = [1.0, 1.6, 2.2, 3.9, 4.5]
    count, gaps = renewal_gaps(renewals, began=1.2, ended=4.0, term_ended=None, now=9.0)
    assert count == 3 and [round(gap, 3) for gap in gaps] == [0.6, 0.6, 1.7, 0.6]
    # No renewal after the attack: the last gap runs to now.
    count, gaps = renewal_gaps(renewals[:3], began=1.2, ended=4.0, term_ended=None, now=5.0)
    assert count == 2 and [round(gap, 3) for gap in gaps] == [0.6, 0.6, 2.8]


def test_the_longest_gap_is_found_where_the_gaps_are_counted() -> None:
    # The window the leader's threads are summarised in (tests/faults/thread_sampler.py).
    renewals = [1.0, 1.6, 2.2, 4.5, 5.1]
    assert longest_gap_window(renewals, began=1.5, ended=5.0, term_ended=None, now=9.0) == (2.2, 4.5)
    # A term that ended: the gap runs to its end, not to the next holder's renewal.
    assert longest_gap_window(renewals, began=1.5, ended=5.0, term_ended=3.0, now=9.0) == (2.2, 3.0)
    assert longest_gap_window([], began=1.5, ended=5.0, term_ended=None, now=9.0) is None


def test_a_loss_while_redis_answered_a_ping_a_whole_request_timeout_late_is_the_machines() -> None:
    # Loaded run #17's slowloris: gaps in bound, no follower asked, this process's timer 0.16 s
    # late; the leader's renewal reached Redis after its own timeout had fired.
    judged = figures(gaps_s=[0.61, 1.07, 0.35], others_redis_stalls=0, machine_lateness_s=0.16)
    assert judged.loss_excuse is None  # the request timeout here is 1 s
    judged.redis_worst_ping_s = 1.0
    assert judged.loss_excuse is not None and "PING of the lock Redis" in judged.loss_excuse
    assert judged.lease_problems() == []
    judged.gaps_s = [0.61, 2.5]  # beyond the lateness bound: the attack's, whatever Redis did
    assert judged.loss_excuse is None


def test_a_redis_stall_excuses_a_gap_as_long_as_the_stall_itself() -> None:
    # Loaded run #22's pipeline_read: a PING took 1.377 s, both followers timed out on Redis, the
    # leader's election thread waited in epoll_wait: the gap (1.949 s) outgrew the lateness bound
    # (0.954 s) by less than the stall.
    judged = figures(gaps_s=[0.61, 0.60, 1.949, 0.20], others_redis_stalls=2, machine_lateness_s=0.027)
    judged.request_timeout_s = 0.3
    assert judged.loss_excuse is None  # no PING measured: the gap is beyond every bound
    judged.redis_worst_ping_s = 1.377
    assert judged.loss_excuse is not None and judged.lease_problems() == []
    judged.gaps_s = [0.61, 2.4]  # longer than the bound and the stall together: the attack's
    assert judged.loss_excuse is None and judged.lease_problems() != []
