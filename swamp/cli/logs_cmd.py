"""``swamp logs``: what a workflow run's steps, or one dispatch, printed — stored, or live.

The lines are read a page at a time (``logs.read``), on either route; ``--follow`` asks again
with its cursor and the orchestrator answers when the next batch is stored, so the reader
paces itself and never the step. Lines came from workers: each is shown escaped
(``swamp.domain.text.printable``), never interpreted by the terminal.
"""

from __future__ import annotations

import json
import sys

import typer

from swamp.cli.common import JSON, ROUTE, Route, command, with_admin

FOLLOW_WAIT = 25.0  # seconds one follow request waits for lines before asking again


class LogPrinter:
    """Turns pages into output lines: a step's name before each line when the output is of
    several steps, and a line where lines are missing (dropped at the cap)."""

    def __init__(self, *, json_output: bool, prefixed: bool) -> None:
        self.json_output = json_output
        self.prefixed = prefixed
        self.labels: dict[str, str] = {}
        self.steps: dict[str, tuple[str | None, str | None]] = {}
        self.jobs: dict[str, set[str | None]] = {}  # step name → the jobs that have one
        self.next: dict[str, tuple[int, int]] = {}  # log → (line, byte) expected next
        self.lines = 0

    def learn(self, page) -> None:
        """The names of the page's logs (a page lists the logs of its chunks). A step's name
        is enough unless two jobs have a step of that name: then ``JOB.STEP``."""
        for info in page.logs:
            if info.step is not None:
                self.jobs.setdefault(info.step, set()).add(info.job)
        for info in page.logs:
            if info.step is None:
                label = f"{info.model_type}.{info.method}"
            elif len(self.jobs[info.step]) > 1:
                label = f"{info.job}.{info.step}"
            else:
                label = info.step
            if info.attempt > 1:
                label += f" (attempt {info.attempt})"
            self.labels.setdefault(info.id, label)  # a log keeps its label once printed
            self.steps[info.id] = (info.job, info.step)
        if len(page.logs) > 1 or page.log_count > 1:
            self.prefixed = True

    def render(self, page) -> str:
        from swamp.domain.step_logs import STREAM_NAMES, gap_marker
        from swamp.domain.text import printable

        out: list[str] = []
        for chunk in page.chunks:
            line_at, byte_at = self.next.get(chunk.log, (0, 0))
            job, step = self.steps.get(chunk.log, (None, None))
            label = self.labels.get(chunk.log, chunk.log[:12])
            if chunk.first > line_at:
                missing, size = chunk.first - line_at, max(0, chunk.first_byte - byte_at)
                if self.json_output:
                    out.append(
                        json.dumps(
                            {
                                "step": step,
                                "job": job,
                                "dispatch": chunk.log,
                                "dropped": {"lines": missing, "bytes": size},
                            }
                        )
                    )
                else:
                    marker = gap_marker(missing, size, page.cap_bytes)
                    out.append(f"{printable(label)} │ {marker}" if self.prefixed else marker)
            self.next[chunk.log] = (chunk.first + len(chunk.lines), chunk.first_byte + chunk.size)
            self.lines += len(chunk.lines)
            if self.json_output:
                for code, line in zip(chunk.streams, chunk.lines, strict=False):
                    out.append(
                        json.dumps(
                            {
                                "step": step,
                                "job": job,
                                "dispatch": chunk.log,
                                "stream": STREAM_NAMES.get(code, "log"),
                                "line": line,
                            }
                        )
                    )
            elif self.prefixed:
                head = f"{printable(label)} │ "
                out.extend(head + printable(line, keep_tab=True) for line in chunk.lines)
            else:
                out.extend(printable(line, keep_tab=True) for line in chunk.lines)
        return "\n".join(out) + "\n" if out else ""


class _Output:
    """Standard output, written from a thread (a paused pager never stops the connection's
    loop); a reader that went away (``| head``) ends the command quietly."""

    def __init__(self) -> None:
        self.closed = False

    async def write(self, text: str) -> None:
        import trio

        if text and not self.closed:
            self.closed = not await trio.to_thread.run_sync(_write, text)


def _write(text: str) -> bool:
    try:
        try:
            sys.stdout.write(text)
        except UnicodeEncodeError:  # a lone surrogate a peer sent, or a narrow terminal
            sys.stdout.flush()
            sys.stdout.buffer.write(text.encode(sys.stdout.encoding or "utf-8", "backslashreplace"))
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return False


async def show(api, ref: str, *, follow: bool, json_output: bool) -> dict:
    """Print the output of ``ref`` (RUN, RUN/STEP or DISPATCH); with ``follow``, until it ends.
    Returns what was shown of it: its kind, id, status, whether it was live."""
    from swamp.protocol.messages import LogsRequest

    out = _Output()
    step = ref.partition("/")[2] or None
    listing = await api.logs_read(LogsRequest(ref=ref, chunks=False))
    whole = listing.id + (f"/{step}" if step else "")  # later pages: by the whole id
    printer = LogPrinter(
        json_output=json_output, prefixed=follow and listing.kind == "run" and step is None
    )
    printer.learn(listing)
    live = listing.live
    last = listing
    cursor = 0
    while not out.closed:  # the whole run with one cursor: its chunks in the order stored
        page = await api.logs_read(
            LogsRequest(ref=whole, after=cursor, wait=FOLLOW_WAIT if follow else 0)
        )
        printer.learn(page)
        await out.write(printer.render(page))
        cursor, last = page.cursor, page
        live = live or page.live
        if not page.more and not (follow and page.live):
            break
    return {
        "kind": listing.kind,
        "id": listing.id,
        "status": last.status,
        "live": live,
        "stillLive": last.live,
        "lines": printer.lines,
        "logs": last.log_count,
        "unfinished": last.status == "running" or last.open_logs > 0,
    }


def say_how_it_ended(shown: dict, *, follow: bool) -> None:
    """One line on stderr, when it tells something: not live, or still running."""
    from swamp.domain.text import printable

    what = f"run {shown['id'][:12]}" if shown["kind"] == "run" else f"dispatch {shown['id']}"
    if not shown["logs"]:
        print(printable(f"{what}: no output stored (nothing printed so far)"), file=sys.stderr)
    if follow and not shown["live"] and shown["unfinished"]:
        print(
            printable(
                f"{what} is not live: no running orchestrator is running it here (this is "
                "what is stored; pass --server to follow it on another)"
            ),
            file=sys.stderr,
        )
    elif not follow and shown["stillLive"]:
        print(printable(f"{what} is still running: --follow streams the rest"), file=sys.stderr)


@command
def logs(
    ref: str = typer.Argument(
        ...,
        metavar="RUN[/STEP] | DISPATCH",
        help="A workflow run id (or a unique prefix, as 'workflow history' shows it), perhaps "
        "with /STEP or /JOB.STEP; or the dispatch id of an ad-hoc run.",
    ),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Keep printing as lines come, until the run or the dispatch ends (needs the "
        "running orchestrator: the repo's, or --server).",
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Print what a workflow run's steps printed, or what one dispatch (an ad-hoc run) printed:
    every line, as stored outside the run record. A run's lines come in the order they were
    stored (steps that ran at once interleave), each after its step's name; with --follow,
    they come as they are stored (within a fraction of a second), until the run ends.

    A step's output is kept up to serve's --step-log-cap (32 MiB by default); past it the
    oldest part goes, and a line says how many lines and bytes went, where they were. It goes
    with its run when the run is collected (a week after it ended).

    Examples: swamp logs 3f9a2c (a run); swamp logs 3f9a2c/build; swamp logs 3f9a2c -f;
    swamp logs 0187c1d2e3f4a5b6 (the dispatch id 'swamp model method run' printed).
    --json: one object per line, {"step", "job", "dispatch", "stream", "line"}.
    """
    from swamp.domain.step_logs import parse_log_ref

    parse_log_ref(ref)  # refused here, the same on either route

    async def go(api) -> dict:
        return await show(api, ref, follow=follow, json_output=json_output)

    # through the repo's running orchestrator when there is one: it knows what is still
    # being written, and stores what has ended before it answers
    shown = with_admin(go, route, prefer_server=True)
    say_how_it_ended(shown, follow=follow)
