"""The orchestrator's WAL checkpoints: from a thread, and soon enough that the log stays small.

The orchestrator's connection never checkpoints by itself (``wal_autocheckpoint=0``): SQLite
would do it inside the committing call, on the event loop, for milliseconds at a time. This task
runs :meth:`Datastore.checkpoint` in a thread instead, one at a time, when

- :data:`CHECKPOINT_AFTER_WRITES` writes went in since the last one (many small rows),
- the log grew by :data:`CHECKPOINT_WAL_BYTES` since the last one (a few large ones: a
  data-plane resource may be 16 MiB) — looked at after every write with one ``lseek`` on a
  descriptor kept for it, so the write that passes the mark starts the checkpoint, whatever
  the machine's speed,
- or :data:`CHECKPOINT_IDLE_SECONDS` after writes, once they stop.

A log left larger than :data:`~swamp.store.datastore.WAL_TRUNCATE_BYTES` is truncated (when
writes overlap checkpoints, as in a burst, the log never starts over by itself); so is any log
once writes stop. Truncating makes writes wait briefly (told busy, retried in trio); should a
reader in another process hold the log open past the wait, the next attempt comes only once the
log has doubled, so such a reader costs a few waits, not one per checkpoint.
"""

from __future__ import annotations

import logging
import os
import sqlite3

import trio

from swamp.errors import SwampError
from swamp.store.datastore import WAL_TRUNCATE_BYTES, Datastore, database_files

log = logging.getLogger("swamp.store")

CHECKPOINT_AFTER_WRITES = 1000
CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024
CHECKPOINT_IDLE_SECONDS = 10
MAX_TRUNCATE_OVER = 1 << 30  # past a reader that never lets go, still try now and then


class WalSize:
    """The size of a database's write-ahead log, read cheaply enough to ask after every write."""

    def __init__(self, db_path) -> None:
        self.path = database_files(db_path)[1]
        self._fd: int | None = None

    def __call__(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return 0  # no log yet: the first write makes it
        try:
            return os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            return 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def run_checkpoints(
    store: Datastore,
    *,
    after_writes: int = CHECKPOINT_AFTER_WRITES,
    wal_bytes: int | None = CHECKPOINT_WAL_BYTES,
    idle_seconds: float = CHECKPOINT_IDLE_SECONDS,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Checkpoint ``store``'s log from a thread whenever it is due (see the module docstring);
    ``wal_bytes=None`` leaves the log's growth out (the count and the quiet spell only)."""
    wal_size = WalSize(store.path)
    wanted = trio.Event()
    seen = store.writes
    base = wal_size()  # the log's size when the last checkpoint ended
    truncate_over = WAL_TRUNCATE_BYTES

    def on_write() -> None:
        if wanted.is_set():
            return
        if store.writes - seen >= after_writes or (
            wal_bytes is not None and wal_size() - base >= wal_bytes
        ):
            wanted.set()

    store.on_write = on_write
    try:
        task_status.started()
        while True:
            quiet = True
            with trio.move_on_after(idle_seconds):
                await wanted.wait()
                quiet = False
            if store.writes != seen:
                seen = store.writes
                over = 0 if quiet else truncate_over  # nothing to hold up when it is quiet

                def checkpoint(over=over) -> int:
                    return store.checkpoint(truncate_over=over)

                try:
                    if wal_size() > over:  # to be truncated: our writes wait meanwhile
                        with store.writes_paused("the write-ahead log is being truncated"):
                            base = await trio.to_thread.run_sync(checkpoint)
                    else:
                        base = await trio.to_thread.run_sync(checkpoint)
                except (sqlite3.Error, SwampError) as exc:  # the next checkpoint catches up
                    log.warning("WAL checkpoint skipped: %s", getattr(exc, "message", exc))
                    base = wal_size()
                if base <= WAL_TRUNCATE_BYTES:  # small again (any reader has let go)
                    truncate_over = WAL_TRUNCATE_BYTES
                elif base > over:  # it was to be truncated, and a reader held it open
                    truncate_over = min(MAX_TRUNCATE_OVER, base * 2)
            wanted = trio.Event()
    finally:
        store.on_write = None
        wal_size.close()
