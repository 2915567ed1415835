"""Settings a command reads from ``swamp.toml`` (its ``[serve]`` table for ``swamp serve``).

The file holds a repo's usual settings so that ``swamp serve`` in the repo needs no flags; what
is given on the command line or in the environment wins over the file, and the file wins over
the command's built-in default. A key is the option's long name without its dashes
(``port``, ``grace-window``); its value is what the flag would take, as TOML: text, a whole
number, ``true``/``false``, or a list of text for an option that may be repeated. A key the
command does not know, or a value of the wrong kind, is refused — a typo in the file must not
quietly leave a setting at its default.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import Enum

from swamp.errors import UserError


class Kind(str, Enum):
    TEXT = "text"
    NUMBER = "a whole number"
    FLAG = "true or false"
    TEXTS = "a list of text"


def _fits(value: object, kind: Kind) -> bool:
    if kind is Kind.FLAG:
        return isinstance(value, bool)
    if kind is Kind.NUMBER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is Kind.TEXTS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, str)


def from_file(
    table: object, known: Mapping[str, Kind], *, given: Collection[str], where: str
) -> dict[str, object]:
    """The settings of ``table`` (one table of a parsed ``swamp.toml``, ``where`` names it in
    messages) that apply: every key checked against ``known`` (key → kind), then those
    ``given`` elsewhere (command line, environment) left out, as they win."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise UserError(f"{where} must be a table of settings, e.g. port = 7420")
    out: dict[str, object] = {}
    for key, value in table.items():
        kind = known.get(key)
        if kind is None:
            raise UserError(f"{where}: unknown setting {key!r} (known: {', '.join(sorted(known))})")
        if not _fits(value, kind):
            raise UserError(f"{where} {key}: expected {kind.value}, got {value!r}")
        if key not in given:
            out[key] = value
    return out
