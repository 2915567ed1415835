"""Worker labels: ``key=value`` pairs that placements match exactly.

Labels come from operators (flags, variables) and from peers (a worker's enrollment, a client's
placement), so both halves are checked with full matches and bounded: at most
:data:`MAX_LABELS` pairs, keys of 63 and values of 128 characters from small alphabets. Nothing a
peer labels itself with can carry a control character, a newline or megabytes of text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from swamp.errors import UserError

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
_VALUE = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")
MAX_LABELS = 64


def parse_label(text: str, *, source: str = "--label") -> tuple[str, str]:
    """Parse one ``key=value``; ``source`` names where it came from, for the error message."""
    key, sep, value = text.partition("=")
    if not sep or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
        shown = text if len(text) <= 80 else text[:80] + "…"
        raise UserError(
            f"invalid label {shown!r} in {source}: expected key=value, the key 1-63 of letters, "
            "digits, '.', '_', '/', '-', the value 1-128 of letters, digits or ._:/@+-"
        )
    return key, value


def _bounded(labels: dict[str, str], source: str) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise UserError(f"too many labels in {source}: {len(labels)} (at most {MAX_LABELS})")
    return labels


def parse_labels(items: Iterable[str], *, source: str = "--label") -> dict[str, str]:
    """Parse many; a later entry for the same key wins."""
    labels: dict[str, str] = {}
    for item in items:
        key, value = parse_label(item, source=source)
        labels[key] = value
    return _bounded(labels, source)


def check_labels(labels: object, *, source: str = "labels") -> dict[str, str]:
    """Validate a labels object received from the network (``{key: value}``)."""
    if not isinstance(labels, dict):
        raise UserError(f"{source} must be an object of key=value strings")
    _bounded(labels, source)
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise UserError(f"{source} must map strings to strings")
        parse_label(f"{key}={value}", source=source)
    return dict(labels)


def check_label_key(key: object, *, source: str = "label keys") -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise UserError(
            f"invalid label key {key!r} in {source}: 1-63 letters, digits, '.', '_', "
            "'/' or '-', starting with a letter or digit"
        )
    return key


def format_labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def merge_labels(
    env_text: str | None, flag_items: Iterable[str], *, env_name: str = "SWAMP_WORKER_LABELS"
) -> dict[str, str]:
    """Labels from the environment (``k=v,k2=v2``; empty entries skipped) merged with ``--label``
    flags; a flag wins over the variable for the same key. Errors name the entry and its source."""
    labels = parse_labels(
        (e.strip() for e in (env_text or "").split(",") if e.strip()), source=env_name
    )
    labels.update(parse_labels(flag_items, source="--label"))
    return _bounded(labels, f"{env_name} and --label")
