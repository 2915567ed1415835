"""Workflow values: ``${{ … }}`` in the strings of a workflow file, evaluated to values.

The expression language (``swamp.domain.language``, written out in ``docs/expressions.md``) as a
whole, over the same tokens and comparison rules as record predicates, plus ``a ? b : c``,
``+``, tables ``{key: value}``, indexing ``a[k]`` and calls ``f(x)``.

Names come from the context (``inputs``, ``self``, ``run``, ``data``, ``workers``); host
functions are callables in it (``data.latest(model, name)``, ``workers.connected({…})``), plus
``size(x)``, ``string(x)``, ``int(x)`` and ``has(a.b)``. A string that is exactly one expression
keeps the value's type; an expression inside other text is turned into text. Parse errors and
evaluation errors are one :class:`ExpressionError` naming the expression.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from swamp.domain.language import (
    COMPARATORS,
    MAX_LENGTH,
    MAX_NESTING,
    Add,
    And,
    Attr,
    Compare,
    Conditional,
    Dialect,
    Has,
    Item,
    ListOf,
    Literal,
    Name,
    Node,
    Not,
    Or,
    ParseError,
    Postfix,
    contains,
    parse,
    truthy,
)
from swamp.errors import ExpressionError, InvalidPredicate

__all__ = [
    "MAX_NESTING",
    "MAX_RENDERED",
    "ExpressionError",
    "as_text",
    "check_templates",
    "compile_expression",
    "evaluate",
    "has_template",
    "render",
]

TEMPLATE = re.compile(r"\$\{\{\s*(.+?)\s*\}\}", re.S)
VALUES = Dialect(
    noun="expression",
    end_found="'the end'",
    too_deep="nested more than {limit} levels deep",
    values=True,
)
Context = dict[str, Any]  # the names an expression may use
Compiled = Callable[[Context], object]
T = TypeVar("T")


class _Missing(Exception):
    """A field that is not there (``has()`` turns it into false; anything else into an error)."""


def _syntax_error(source: str, exc: ParseError) -> ExpressionError:
    if exc.lexical:  # worded as the predicate's error, as it always was
        return ExpressionError(
            f"in ${{{{ {source} }}}}: {InvalidPredicate(exc.message, source, exc.position).message}"
        )
    return ExpressionError(
        f"in ${{{{ {source} }}}}: {exc.message} (at character {exc.position + 1})"
    )


# -- the evaluator: a tree of closures, built once -------------------------------------------------


def _compile(node: Node, source: str) -> Compiled:
    """``node`` as a function of the context (``source`` names the expression in errors)."""
    if isinstance(node, Literal):
        value = node.value
        return lambda c: value
    if isinstance(node, Name):
        name = node.name
        builtin = _BUILTINS.get(name)
        if builtin is not None:
            return lambda c: builtin
        return lambda c: _name(c, name)
    if isinstance(node, Postfix):
        return _postfix(_compile(node.base, source), node, source)
    if isinstance(node, Has):
        inner = _compile(node.operand, source)
        return lambda c: _has(inner, c)
    if isinstance(node, Not):
        operand = _compile(node.operand, source)
        return lambda c: not truthy(operand(c))
    if isinstance(node, (And, Or)):
        terms = [_compile(t, source) for t in node.terms]
        if isinstance(node, And):
            return lambda c: all(truthy(t(c)) for t in terms)
        return lambda c: any(truthy(t(c)) for t in terms)
    if isinstance(node, Compare):
        left, right = _compile(node.left, source), _compile(node.right, source)
        if node.op == "in":
            return lambda c: contains(right(c), left(c))
        fn = COMPARATORS[node.op]
        return lambda c: fn(left(c), right(c))
    if isinstance(node, Add):
        addends = [_compile(t, source) for t in node.terms]
        return lambda c: _add([t(c) for t in addends], source)
    if isinstance(node, Conditional):
        test, yes = _compile(node.test, source), _compile(node.yes, source)
        no = _compile(node.no, source)
        return lambda c: yes(c) if truthy(test(c)) else no(c)
    if isinstance(node, ListOf):
        items = [_compile(i, source) for i in node.items]
        return lambda c: [item(c) for item in items]
    pairs = [(_compile(k, source), _compile(v, source)) for k, v in node.pairs]
    return lambda c: {_key(k(c), source): v(c) for k, v in pairs}


def _postfix(base: Compiled, node: Postfix, source: str) -> Compiled:
    """A chain of fields, indexes and calls, applied in a loop (a long ``a.b.c…`` does not
    recurse)."""
    steps: list[Callable[[object, Context], object]] = []
    for suffix in node.suffixes:
        if isinstance(suffix, Attr):
            steps.append(_member(suffix.name))
        elif isinstance(suffix, Item):
            steps.append(_index(_compile(suffix.key, source)))
        else:
            steps.append(_call([_compile(a, source) for a in suffix.args], source))

    def chain(c: Context) -> object:
        value = base(c)
        for step in steps:
            value = step(value, c)
        return value

    return chain


def _name(context: Context, name: str) -> object:
    if name not in context:
        raise ExpressionError(
            f"unknown name {name!r} (names here: {', '.join(sorted(context)) or 'none'})"
        )
    return context[name]


def _member(name: str) -> Callable[[object, Context], object]:
    def get(value: object, c: Context) -> object:
        if isinstance(value, dict):
            if name not in value:
                raise _Missing(name)
            return value[name]
        raise ExpressionError(f"cannot take field {name!r} of {_kind(value)}")

    return get


def _index(key: Compiled) -> Callable[[object, Context], object]:
    def get(value: object, c: Context) -> object:
        k = key(c)
        if isinstance(value, list) and isinstance(k, int) and not isinstance(k, bool):
            if -len(value) <= k < len(value):
                return value[k]
            raise _Missing(str(k))
        if isinstance(value, dict) and isinstance(k, str):
            if k not in value:
                raise _Missing(k)
            return value[k]
        raise ExpressionError(f"cannot index {_kind(value)} with {_kind(k)}")

    return get


def _call(args: list[Compiled], source: str) -> Callable[[object, Context], object]:
    def call(fn: object, c: Context) -> object:
        if not callable(fn):
            raise ExpressionError(f"{_kind(fn)} is not a function")
        values = [a(c) for a in args]
        try:
            return fn(*values)
        except TypeError as exc:
            raise ExpressionError(f"in ${{{{ {source} }}}}: bad arguments: {exc}") from None

    return call


def _has(inner: Compiled, c: Context) -> bool:
    try:
        inner(c)
    except _Missing:
        return False
    return True


def _add(values: list[Any], source: str) -> object:
    first = values[0]
    for kind in (str, list):
        if isinstance(first, kind) and all(isinstance(v, kind) for v in values):
            if sum(len(v) for v in values) > MAX_RENDERED:
                raise ExpressionError(
                    f"in ${{{{ {source} }}}}: the sum would be longer than {MAX_RENDERED}"
                )
            return "".join(values) if kind is str else [x for v in values for x in v]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sum(values)
    raise ExpressionError(f"in ${{{{ {source} }}}}: cannot add {', '.join(map(_kind, values))}")


def _key(value: object, source: str) -> str:
    if not isinstance(value, str):
        raise ExpressionError(f"in ${{{{ {source} }}}}: a map key must be a string")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), "a list" if isinstance(value, list) else "a map"
    )


def _size(value: object) -> int:
    if isinstance(value, (str, list, dict)):
        return len(value)
    raise ExpressionError(f"size() of {_kind(value)}")


def _int(value: object) -> int:
    try:
        number: int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ExpressionError(f"int() of {_kind(value)} {value!r}") from None
    return number


# names that are functions whatever the context holds (``has`` is syntax: ``has(x)``)
_BUILTINS: dict[str, Callable[[object], object]] = {
    "size": _size,
    "string": lambda v: as_text(v),
    "int": _int,
}


# -- the public surface ---------------------------------------------------------------------------


_CACHE: dict[str, Compiled] = {}


def compile_expression(source: str) -> Compiled:
    node = _CACHE.get(source)
    if node is None:
        if len(source) > MAX_LENGTH:
            raise ExpressionError(f"an expression may be at most {MAX_LENGTH} characters")
        try:
            tree = parse(source, VALUES)
        except ParseError as exc:
            raise _syntax_error(source, exc) from None
        node = _compile(tree, source)
        if len(_CACHE) < 4096:
            _CACHE[source] = node
    return node


def evaluate(source: str, context: Context) -> object:
    node = compile_expression(source)
    try:
        return node(context)
    except _Missing as exc:
        raise ExpressionError(f"in ${{{{ {source} }}}}: no field {exc.args[0]!r}") from None
    except ExpressionError as exc:
        if exc.message.startswith("in ${{"):
            raise
        raise ExpressionError(f"in ${{{{ {source} }}}}: {exc.message}") from None


def as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def has_template(value: object) -> bool:
    return isinstance(value, str) and TEMPLATE.search(value) is not None


MAX_RENDERED = 256 * 1024  # a rendered value, as text or as JSON: it travels to a worker


def _capped(value: T, source: str) -> T:
    size = len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
    if size > MAX_RENDERED:
        raise ExpressionError(
            f"{source!r} renders to {size} characters; a rendered value may be at most "
            f"{MAX_RENDERED} (narrow the query, or pick the fields you need)"
        )
    return value


def render(value: object, context: Context) -> object:
    """``value`` with every ``${{ … }}`` evaluated (strings, lists and maps, recursively).
    What one string renders to is at most :data:`MAX_RENDERED` characters (as JSON, for a
    value that is not text)."""
    if isinstance(value, str):
        if "${{" not in value:
            return value
        whole = TEMPLATE.fullmatch(value.strip())
        if whole is not None and value.count("${{") == 1:
            return _capped(evaluate(whole.group(1), context), value[:80])
        return _capped(
            TEMPLATE.sub(
                lambda m: _capped(as_text(evaluate(m.group(1), context)), value[:80]), value
            ),
            value[:80],
        )
    if isinstance(value, list):
        return [render(v, context) for v in value]
    if isinstance(value, dict):
        return {k: render(v, context) for k, v in value.items()}
    return value


def check_templates(value: object) -> None:
    """Parse every expression in ``value`` (validation: nothing is evaluated)."""
    if isinstance(value, str):
        if "${{" in value and value.count("${{") != len(TEMPLATE.findall(value)):
            raise ExpressionError(f"an unterminated ${{{{ in {value!r}")
        for match in TEMPLATE.finditer(value):
            compile_expression(match.group(1))
    elif isinstance(value, list):
        for v in value:
            check_templates(v)
    elif isinstance(value, dict):
        for v in value.values():
            check_templates(v)
