import trio

from swamp.orchestrator.timers import Deadlines


async def test_deadlines_fire_in_order_rearm_and_cancel(nursery, autojump_clock):
    fired = []
    deadlines = Deadlines("test")

    async def on_due(key):
        fired.append((key, round(trio.current_time())))
        if key == "boom":
            raise RuntimeError("a failing callback")

    await nursery.start(deadlines.run, on_due)
    start = round(trio.current_time())
    deadlines.set("b", trio.current_time() + 20)
    deadlines.set("a", trio.current_time() + 10)
    deadlines.set("gone", trio.current_time() + 5)
    deadlines.set("boom", trio.current_time() + 7)
    deadlines.cancel("gone")
    deadlines.set("b", trio.current_time() + 30)  # re-armed later
    await trio.sleep(40)
    assert fired == [("boom", start + 7), ("a", start + 10), ("b", start + 30)]
    assert "b" not in deadlines
