"""Advisory locks held by one process at a time (``swamp.store.pg_locks``) on a real server:
a second holder waits its turn; a holder killed with SIGKILL frees the lock for the next; a
holder whose connection the server ends has its block cancelled and is told so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from swamp.errors import Fenced, LockHeld, LockLost
from swamp.store import pg
from swamp.store.pg_locks import held, lock_key

ROOT = Path(__file__).resolve().parents[2]


def test_a_lock_name_is_a_signed_64_bit_key():
    keys = {lock_key(f"swamp/orchestrator/{i}") for i in range(1000)}
    assert len(keys) == 1000 and all(-(2**63) <= k < 2**63 for k in keys)
    assert lock_key("swamp/singletons") == lock_key("swamp/singletons")


async def test_a_second_holder_waits_its_turn(pg_url):
    order: list[str] = []
    first_in = trio.Event()
    let_go = trio.Event()

    async def first() -> None:
        async with held(pg_url, "swamp/singletons"):
            order.append("first holds")
            first_in.set()
            await let_go.wait()
            order.append("first lets go")

    async def second() -> None:
        await first_in.wait()
        async with held(pg_url, "swamp/singletons"):
            order.append("second holds")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        nursery.start_soon(second)
        await first_in.wait()
        # the second is queued on the server: the server says so, and tells no one (no event
        # to wait on), so it is asked until it does
        async with await pg.connect(pg_url) as look:
            with trio.fail_after(30):
                while not (  # noqa: ASYNC110
                    await look.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    )
                ).rows[0][0]:
                    await trio.sleep(0.01)
        let_go.set()
    assert order == ["first holds", "first lets go", "second holds"]


async def test_the_lock_of_a_killed_holder_goes_to_the_next(pg_url):
    """Another process holds the lock; it is killed with SIGKILL (its connection closes with
    it): the one waiting takes the lock."""
    holder = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, trio
                from swamp.store.pg_locks import held
                async def main():
                    async with held({pg_url!r}, "swamp/orchestrator/a"):
                        print("held", flush=True)
                        await trio.sleep_forever()
                trio.run(main)
                """
            ),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None
        said = b""
        with trio.fail_after(60):
            while not said.endswith(b"\n"):
                chunk = await holder.stdout.receive_some(64)
                assert chunk, "the holder ended before it held the lock"
                said += chunk
        assert said.strip() == b"held"
        taken = trio.Event()

        async def next_in_line() -> None:
            async with held(pg_url, "swamp/orchestrator/a"):
                taken.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(next_in_line)
            await trio.sleep(0.2)
            assert not taken.is_set()  # the holder is alive: it waits
            holder.send_signal(signal.SIGKILL)
            with trio.fail_after(60):
                await taken.wait()
    finally:
        holder.kill()
        await holder.wait()


async def test_a_holder_whose_connection_is_ended_is_told_and_its_block_cancelled(pg_url):
    reached_end = []
    with pytest.raises(LockLost, match="swamp/singletons"):
        async with held(pg_url, "swamp/singletons"):
            async with await pg.connect(pg_url) as admin:
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = "
                    "'advisory' AND granted AND pid <> pg_backend_pid()"
                )
            with trio.fail_after(30):
                await trio.sleep_forever()  # cancelled by the loss, not the deadline
            reached_end.append(True)
    assert not reached_end
    async with held(pg_url, "swamp/singletons"):  # free again
        pass


async def test_what_the_block_raises_comes_out_as_itself(pg_url):
    with pytest.raises(Fenced, match="the block's own"):
        async with held(pg_url, "swamp/x"):
            raise Fenced("the block's own error")
    with trio.move_on_after(0.2) as scope:  # cancelled from outside: as itself too
        async with held(pg_url, "swamp/x"):
            await trio.sleep_forever()
    assert scope.cancelled_caught
    with trio.fail_after(30):  # and the lock was let go each time
        async with held(pg_url, "swamp/x"):
            pass


async def test_without_waiting_a_held_lock_is_refused_at_once_and_free_once_let_go(pg_url):
    async with held(pg_url, "swamp serve"):
        with pytest.raises(LockHeld, match="held by another process"):
            async with held(pg_url, "swamp serve", wait=False):
                raise AssertionError("never entered")
    async with held(pg_url, "swamp serve", wait=False):  # let go: free again
        pass
