"""Output that cannot stall the event loop: streamed lines go through a bounded queue to a
thread that writes them.

``swamp model method run … | less`` left open, or a suspended terminal, must not stop the CLI
from reading its socket and answering heartbeats, so the loop never writes to a pipe itself.
When the queue is full, lines are dropped and counted: the first drop is said at once on
stderr, the count at the end.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import TextIO

QUEUE_LINES = 10_000
_DONE = object()


class LinePump:
    def __init__(self, *, max_lines: int = QUEUE_LINES) -> None:
        self._queue: queue.Queue = queue.Queue(max_lines)
        self.dropped = 0
        self.broken = False  # the reader went away (a closed pipe)
        self._thread = threading.Thread(target=self._write, name="swamp-output", daemon=True)
        self._thread.start()

    def line(self, text: str, stream: TextIO | None = None, *, end: str = "\n") -> None:
        """Queue one line for ``stream`` (stdout by default); never blocks."""
        try:
            self._queue.put_nowait((text, stream or sys.stdout, end))
        except queue.Full:
            if not self.dropped:
                self._say_dropping()
            self.dropped += 1

    def _say_dropping(self) -> None:
        """One line, now, where the reader of the output is not the reader of the errors."""
        try:
            print(
                "… the output is not being read fast enough: dropping lines (counted at the end)",
                file=sys.stderr,
                flush=True,
            )
        except OSError:
            pass

    def close(self) -> None:
        """Wait until every queued line is written (or the pipe is gone)."""
        self._queue.put(_DONE)
        self._thread.join()

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if self.broken:
                continue
            text, stream, end = item
            try:
                print(text, file=stream, end=end, flush=True)
            except BrokenPipeError:
                self.broken = True
            except OSError:
                self.broken = True
