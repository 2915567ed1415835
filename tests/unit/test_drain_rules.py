"""The drain's rules: signals escalate, triggers drain once, what a dispatch is refused for."""

from swamp.domain.drain import (
    Action,
    Stage,
    last_allowed,
    on_drain_timeout,
    on_signal,
    on_trigger,
    refusal,
    timeout_reached,
)


def test_signals_escalate_drain_force_exit():
    stage, action = on_signal(Stage.RUNNING)
    assert (stage, action) == (Stage.DRAINING, Action.DRAIN)
    stage, action = on_signal(stage)
    assert (stage, action) == (Stage.FORCING, Action.FORCE)
    assert on_signal(stage) == (Stage.EXITING, Action.EXIT_NOW)


def test_a_trigger_drains_once_and_never_escalates():
    stage, action = on_trigger(Stage.RUNNING)
    assert (stage, action) == (Stage.DRAINING, Action.DRAIN)
    assert on_trigger(stage) == (Stage.DRAINING, Action.NOTHING)
    assert on_trigger(Stage.FORCING) == (Stage.FORCING, Action.NOTHING)


def test_what_a_dispatch_is_refused_for():
    def refused(stage=Stage.RUNNING, active=0, capacity=2, started=0, most=None):
        return refusal(
            stage, active=active, capacity=capacity, started=started, max_dispatches=most
        )

    assert refused() is None
    assert refused(active=2) == "worker_busy"
    assert refused(stage=Stage.DRAINING) == "worker_draining"
    assert refused(started=2, most=2) == "worker_draining"  # the allowance is used up
    assert refused(started=1, most=2) is None
    assert last_allowed(2, 2) and not last_allowed(1, 2) and not last_allowed(5, None)


def test_the_drain_timeout_forces_a_waiting_drain_once_and_says_so():
    assert on_drain_timeout(Stage.DRAINING) == (Stage.FORCING, Action.FORCE)
    for stage in (Stage.FORCING, Stage.EXITING, Stage.RUNNING):
        assert on_drain_timeout(stage) == (stage, Action.NOTHING)
    assert timeout_reached(300, 2) == (
        "drain timeout (300s) reached with 2 dispatches running: stopping them"
    )
    assert (
        timeout_reached(90, 1) == "drain timeout (90s) reached with 1 dispatch running: stopping it"
    )
