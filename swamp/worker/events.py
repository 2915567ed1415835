"""The worker's status events: one line each, for people or (``--json``) for machines."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

from swamp.domain.text import printable


class Reporter:
    def __init__(self, *, json_lines: bool, verbose: bool = False, stream=None) -> None:
        self.json_lines = json_lines
        # a line per dispatch (started, finished) for machines (--json) or on request
        # (--verbose); a busy worker's journal otherwise holds its lifecycle only
        self.per_dispatch = json_lines or verbose
        self.stream = stream or sys.stdout

    def emit(self, event: str, **fields) -> None:
        if self.json_lines:
            now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            line = json.dumps({"event": event, "time": now.replace("+00:00", "Z"), **fields})
        else:
            line = printable(_human(event, fields))  # reasons come from the orchestrator
        print(line, file=self.stream, flush=True)


def _human(event: str, f: dict) -> str:
    if event == "connecting":
        return f"connecting to {f['url']} (attempt {f['attempt']})"
    if event == "enrolled":
        again = " (reconnected)" if f.get("reconnect") else ""
        capped = (
            (
                f"; the token allows {f['capacity']} slot(s), not the "
                f"{f['requestedCapacity']} asked for"
            )
            if f.get("requestedCapacity")
            else ""
        )
        return f"enrolled as {f['workerName']}{again}{capped}"
    if event == "dispatch_started":
        return f"▶ dispatch {f['dispatchId'][:8]}: {f['modelType']}.{f['method']}"
    if event == "dispatch_finished":
        mark = "✓" if f["status"] == "succeeded" else "✗"
        tail = f" — {f['error']}" if f.get("error") else ""
        return f"{mark} dispatch {f['dispatchId'][:8]}: {f['status']} in {f['durationMs']}ms{tail}"
    if event == "disconnected":
        return f"disconnected: {f['reason']}"
    if event == "retrying":
        return f"reconnecting in {f['delaySeconds']:g}s"
    if event == "fleet_full":
        return f"not enrolled: {f['reason']}"
    if event == "waiting_for_place":
        return f"waiting for a place in the fleet: asking again in {f['delaySeconds']:g}s"
    if event == "draining":
        return (
            f"draining ({f['reason']}): no new work; waiting for {f['running']} running "
            "dispatch(es) to finish"
        )
    if event == "drain_complete":
        return "drain complete"
    if event == "forcing":
        if f.get("reason"):  # the drain timeout: its own words
            return f["reason"]
        return f"{f['signal']} during the drain: stopping {f['stopping']} running dispatch(es)"
    if event == "stopped":
        return f"worker stopped: {f['reason']} (exit {f['exitCode']})"
    if event == "token_renewed":
        return (
            f"{f['source']} gave a new token (the last one was refused: {f['after']}); "
            "enrolling with it"
        )
    if event == "carrying":
        return (
            f"carrying {f['dispatches']} running dispatch(es) to the next orchestrator "
            f"(for {f['seconds']:g}s at most)"
        )
    if event == "adopted":
        return f"dispatch {f['dispatchId'][:8]} taken over by this orchestrator: it runs on"
    if event == "warning":
        return f"warning: {f['message']}"
    return f"{event}: {f}"
