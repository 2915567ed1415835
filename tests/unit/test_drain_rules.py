"""The drain's rules: signals escalate, triggers drain once, what a dispatch is refused for."""

from swamp.domain.drain import (
    Action,
    Stage,
    last_allowed,
    on_signal,
    on_trigger,
    refusal,
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
