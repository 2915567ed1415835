"""Record predicates: the expression language (``swamp.domain.language``) as a query over data
records, for ``data query``, ``query_data`` and the workflow functions ``data.query()``.

A predicate is the language without ``?:``, ``+``, tables, calls or indexing, whose names are a
record's fields (``modelType modelName name version spec attributes createdAt size``, then
``.name`` as deep as needed)::

    predicate := or
    operand   := literal | path | "[" operand, … "]" | "has" "(" path ")" | "(" predicate ")"

Parsed once, then evaluated per record. A missing field never raises: it is unequal to
everything, ordering against it is false, and ``has(path)`` tests for it. Errors point at the
character where parsing stopped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swamp.domain import language
from swamp.domain.language import (
    COMPARATORS,
    MAX_LENGTH,
    MAX_NESTING,
    MISSING,
    And,
    Attr,
    Compare,
    Dialect,
    Has,
    ListOf,
    Literal,
    Name,
    Node,
    Not,
    Or,
    ParseError,
    Postfix,
    contains,
    tokenize,
    truthy,
    unquote,
)
from swamp.errors import InvalidPredicate, UserError

FIELDS = ("modelType", "modelName", "name", "version", "spec", "attributes", "createdAt", "size")
PREDICATES = Dialect(
    noun="predicate",
    end_found="the end of the predicate",
    too_deep="the predicate is nested more than {limit} levels deep",
    values=False,
    roots=FIELDS,
)
MAX_PREDICATE_LENGTH = MAX_LENGTH
__all__ = [
    "FIELDS",
    "MAX_NESTING",
    "MAX_PREDICATE_LENGTH",
    "InvalidPredicate",
    "Predicate",
    "compile_predicate",
    "parse",
]

Record = dict[str, Any]  # a data record as JSON (``Record.to_json()``)
Evaluator = Callable[[Record], object]


@dataclass(frozen=True)
class Predicate:
    """A parsed predicate: call ``matches(record)``; ``equalities`` help the store pre-filter."""

    source: str
    evaluate: Evaluator
    equalities: dict[str, str]

    def matches(self, record: Record) -> bool:
        return truthy(self.evaluate(record))


_SURROGATE = re.compile("[\ud800-\udfff]")


def parse(source: str) -> Predicate:
    if not isinstance(source, str):
        raise UserError("a predicate must be a string")
    if len(source) > MAX_PREDICATE_LENGTH:
        raise UserError(f"a predicate may be at most {MAX_PREDICATE_LENGTH} characters")
    lone = _SURROGATE.search(source)
    if lone is not None:  # no record holds one, and it cannot be sent, stored or printed
        raise InvalidPredicate(
            f"{lone.group()!r} is a lone surrogate, not a character (was the argument "
            "valid UTF-8?)",
            source,
            lone.start(),
        )
    try:
        tree = language.parse(source, PREDICATES)
    except ParseError as exc:
        raise InvalidPredicate(exc.message, source, exc.position) from None
    return Predicate(
        source=source, evaluate=compile_predicate(tree), equalities=_top_equalities(source)
    )


# -- the evaluator: a tree of closures, built once -------------------------------------------------


def compile_predicate(node: Node) -> Evaluator:
    """``node`` (from the predicate dialect) as a function of a record."""
    if isinstance(node, Literal):
        value = node.value
        return lambda r: value
    if isinstance(node, (Name, Postfix)):
        path = _path(node)
        return lambda r: _lookup(r, path)
    if isinstance(node, Has):
        path = _path(node.operand)
        return lambda r: _lookup(r, path) is not MISSING
    if isinstance(node, Not):
        inner = compile_predicate(node.operand)
        return lambda r: not truthy(inner(r))
    if isinstance(node, (And, Or)):
        # flat lists, not a chain of closures: a long a || b || c … evaluates without recursion
        terms = [compile_predicate(t) for t in node.terms]
        if isinstance(node, And):
            return lambda r: all(truthy(term(r)) for term in terms)
        return lambda r: any(truthy(term(r)) for term in terms)
    if isinstance(node, Compare):
        left, right = compile_predicate(node.left), compile_predicate(node.right)
        if node.op == "in":
            return lambda r: contains(right(r), left(r))
        fn = COMPARATORS[node.op]
        return lambda r: fn(left(r), right(r))
    if isinstance(node, ListOf):
        items = [compile_predicate(i) for i in node.items]
        return lambda r: [item(r) for item in items]
    raise ValueError(f"not a predicate: {node!r}")  # the predicate dialect makes none of these


def _path(node: Node) -> tuple[str, ...]:
    if isinstance(node, Name):
        return (node.name,)
    if isinstance(node, Postfix) and isinstance(node.base, Name):
        names = [s.name for s in node.suffixes if isinstance(s, Attr)]
        if len(names) == len(node.suffixes):
            return (node.base.name, *names)
    raise ValueError(f"not a field: {node!r}")


def _lookup(record: Record, path: tuple[str, ...]) -> object:
    value: object = record
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def _top_equalities(source: str) -> dict[str, str]:
    """``field == "literal"`` terms joined only by ``&&`` at the top level (for SQL pre-filters).

    Conservative: any ``||``, ``!`` or parenthesis anywhere disables the pre-filter entirely.
    """
    tokens = tokenize(source)
    if any(t.kind == "op" and t.text in ("||", "!", "(", ")") for t in tokens):
        return {}
    found: dict[str, str] = {}
    for i in range(len(tokens) - 2):
        a, op, b = tokens[i], tokens[i + 1], tokens[i + 2]
        if (
            a.kind == "ident"
            and a.text in ("modelType", "modelName", "name", "spec")
            and op.text == "=="
            and b.kind == "string"
            and (i == 0 or tokens[i - 1].text == "&&")
            and tokens[i + 3].text in ("&&", "")
        ):
            found[a.text] = unquote(b.text)
    return found
