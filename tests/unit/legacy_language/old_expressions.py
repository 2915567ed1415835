"""Expressions in workflow files: ``${{ … }}`` in string values, evaluated to values.

The query language (``swamp.domain.query``) extended from predicates to values, over the same
tokens and the same comparison rules::

    expr    := or ( "?" expr ":" expr )?
    or      := and ( "||" and )*
    and     := unary ( "&&" unary )*
    unary   := "!" unary | compare
    compare := sum ( ("==" | "!=" | "<" | "<=" | ">" | ">=" | "in") sum )?
    sum     := postfix ( "+" postfix )*
    postfix := primary ( "." name | "[" expr "]" | "(" args ")" )*
    primary := literal | name | "[" list "]" | "{" key ":" expr , … "}" | "(" expr ")"

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
from typing import TypeVar

from swamp.errors import ExpressionError, InvalidPredicate
from tests.unit.legacy_language.old_query import _COMPARATORS, _contains, _tokenize, _unquote

TEMPLATE = re.compile(r"\$\{\{\s*(.+?)\s*\}\}", re.S)
MAX_NESTING = 32
Node = Callable[[dict], object]
T = TypeVar("T")


class _Missing(Exception):
    """A field that is not there (``has()`` turns it into false; anything else into an error)."""


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self.tokens = _tokenize(source)
        except InvalidPredicate as exc:
            raise ExpressionError(f"in ${{{{ {source} }}}}: {exc.message}") from None
        self.index = 0
        self.depth = 0

    @property
    def tok(self):
        return self.tokens[self.index]

    def fail(self, message: str) -> ExpressionError:
        return ExpressionError(
            f"in ${{{{ {self.source} }}}}: {message} (at character {self.tok.pos + 1})"
        )

    def take(self, text: str) -> bool:
        if self.tok.kind == "op" and self.tok.text == text:
            self.index += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.take(text):
            raise self.fail(f"expected {text!r}, found {self.tok.text or 'the end'!r}")

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"nested more than {MAX_NESTING} levels deep")

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise self.fail("the expression is empty")
        node = self.expr()
        if self.tok.kind != "end":
            raise self.fail(f"unexpected {self.tok.text!r}")
        return node

    def expr(self) -> Node:
        self.nest()
        cond = self.or_()
        if self.take("?"):
            yes = self.expr()
            self.expect(":")
            no = self.expr()
            self.depth -= 1
            return lambda c: yes(c) if _truth(cond(c)) else no(c)
        self.depth -= 1
        return cond

    def or_(self) -> Node:
        terms = [self.and_()]
        while self.take("||"):
            terms.append(self.and_())
        if len(terms) == 1:
            return terms[0]
        return lambda c: any(_truth(t(c)) for t in terms)

    def and_(self) -> Node:
        terms = [self.unary()]
        while self.take("&&"):
            terms.append(self.unary())
        if len(terms) == 1:
            return terms[0]
        return lambda c: all(_truth(t(c)) for t in terms)

    def unary(self) -> Node:
        if self.take("!"):
            self.nest()
            inner = self.unary()
            self.depth -= 1
            return lambda c: not _truth(inner(c))
        return self.compare()

    def compare(self) -> Node:
        left = self.sum()
        tok = self.tok
        if tok.kind == "op" and tok.text in _COMPARATORS:
            self.index += 1
            right, fn = self.sum(), _COMPARATORS[tok.text]
            return lambda c: fn(left(c), right(c))
        if tok.kind == "ident" and tok.text == "in":
            self.index += 1
            right = self.sum()
            return lambda c: _contains(right(c), left(c))
        return left

    def sum(self) -> Node:
        terms = [self.postfix()]
        while self.take("+"):
            terms.append(self.postfix())
        if len(terms) == 1:
            return terms[0]
        return lambda c: _add([t(c) for t in terms], self.source)

    def postfix(self) -> Node:
        node = self.primary()
        while True:
            if self.take("."):
                if self.tok.kind != "ident":
                    raise self.fail("expected a name after '.'")
                name = self.tok.text
                self.index += 1
                node = _member(node, name)
            elif self.take("["):
                self.nest()
                key = self.expr()
                self.expect("]")
                self.depth -= 1
                node = _index(node, key)
            elif self.take("("):
                self.nest()
                args = self.args(")")
                self.depth -= 1
                node = _call(node, args, self.source)
            else:
                return node

    def args(self, close: str) -> list[Node]:
        items: list[Node] = []
        if self.take(close):
            return items
        while True:
            items.append(self.expr())
            if self.take(close):
                return items
            self.expect(",")

    def primary(self) -> Node:
        tok = self.tok
        if tok.kind == "end":
            raise self.fail("the expression ends where a value was expected")
        if tok.kind == "number":
            self.index += 1
            value = float(tok.text) if "." in tok.text else int(tok.text)
            return lambda c: value
        if tok.kind == "string":
            self.index += 1
            text = _unquote(tok.text)
            return lambda c: text
        if self.take("("):
            self.nest()
            inner = self.expr()
            self.expect(")")
            self.depth -= 1
            return inner
        if self.take("["):
            self.nest()
            items = self.args("]")
            self.depth -= 1
            return lambda c: [item(c) for item in items]
        if self.take("{"):
            self.nest()
            pairs: list[tuple[Node, Node]] = []
            if not self.take("}"):
                while True:
                    key = self.expr()
                    self.expect(":")
                    pairs.append((key, self.expr()))
                    if self.take("}"):
                        break
                    self.expect(",")
            self.depth -= 1
            return lambda c: {_key(k(c), self.source): v(c) for k, v in pairs}
        if tok.kind == "ident":
            self.index += 1
            if tok.text in ("true", "false", "null"):
                value = {"true": True, "false": False, "null": None}[tok.text]
                return lambda c: value
            if tok.text in _BUILTINS:
                if tok.text == "has":
                    self.expect("(")
                    inner = self.expr()
                    self.expect(")")
                    return lambda c: _has(inner, c)
                fn = _BUILTINS[tok.text]
                return lambda c: fn
            name = tok.text
            return lambda c: _name(c, name)
        raise self.fail(f"unexpected {tok.text!r} where a value was expected")


def _truth(value: object) -> bool:
    return value is True


def _name(context: dict, name: str) -> object:
    if name not in context:
        raise ExpressionError(
            f"unknown name {name!r} (names here: {', '.join(sorted(context)) or 'none'})"
        )
    return context[name]


def _member(node: Node, name: str) -> Node:
    def get(c: dict) -> object:
        value = node(c)
        if isinstance(value, dict):
            if name not in value:
                raise _Missing(name)
            return value[name]
        raise ExpressionError(f"cannot take field {name!r} of {_kind(value)}")

    return get


def _index(node: Node, key: Node) -> Node:
    def get(c: dict) -> object:
        value, k = node(c), key(c)
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


def _call(node: Node, args: list[Node], source: str) -> Node:
    def call(c: dict) -> object:
        fn = node(c)
        if not callable(fn):
            raise ExpressionError(f"{_kind(fn)} is not a function")
        values = [a(c) for a in args]
        try:
            return fn(*values)
        except TypeError as exc:
            raise ExpressionError(f"in ${{{{ {source} }}}}: bad arguments: {exc}") from None

    return call


def _has(inner: Node, c: dict) -> bool:
    try:
        inner(c)
    except _Missing:
        return False
    return True


def _add(values: list, source: str) -> object:
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
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ExpressionError(f"int() of {_kind(value)} {value!r}") from None


_BUILTINS: dict[str, Callable] = {"size": _size, "string": lambda v: as_text(v), "int": _int}
_BUILTINS["has"] = _has


# -- the public surface ---------------------------------------------------------------------------


_CACHE: dict[str, Node] = {}


def compile_expression(source: str) -> Node:
    node = _CACHE.get(source)
    if node is None:
        if len(source) > 4096:
            raise ExpressionError("an expression may be at most 4096 characters")
        node = _Parser(source).parse()
        if len(_CACHE) < 4096:
            _CACHE[source] = node
    return node


def evaluate(source: str, context: dict) -> object:
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


def render(value: object, context: dict) -> object:
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
