"""How long the data of ad-hoc runs is kept.

Each ad-hoc run (a model type run with no instance named) is an instance of its own, so the
versions a spec keeps per item never bound it: every run adds items. The orchestrator's
collector forgets ad-hoc runs whose last write is older than the retention, and all but the
newest few of each model type, whatever their age — so the store stays bounded however many
runs there are, as it did when every ad-hoc run of a type shared one instance.
"""

from __future__ import annotations

from collections.abc import Iterable

RETENTION_SECONDS = 7 * 24 * 3600
KEPT_PER_TYPE = 1000


def runs_to_forget(
    runs: Iterable[tuple[str, str, float]],
    *,
    now: float,
    retention: float = RETENTION_SECONDS,
    keep: int = KEPT_PER_TYPE,
) -> list[tuple[str, str]]:
    """``runs``: (model type, instance, epoch of its last write). The (type, instance) pairs
    to forget: older than ``retention``, or past the newest ``keep`` of their type."""
    by_type: dict[str, list[tuple[float, str]]] = {}
    for model_type, name, last in runs:
        by_type.setdefault(model_type, []).append((last, name))
    out = []
    for model_type, items in sorted(by_type.items()):
        items.sort(reverse=True)
        for index, (last, name) in enumerate(items):
            if index >= keep or last < now - retention:
                out.append((model_type, name))
    return out
