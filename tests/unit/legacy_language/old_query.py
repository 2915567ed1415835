"""A small CEL subset for selecting data records.

Grammar (precedence low to high)::

    expr    := and ( "||" and )*
    and     := unary ( "&&" unary )*
    unary   := "!" unary | compare
    compare := operand ( ("==" | "!=" | "<" | "<=" | ">" | ">=" | "in") operand )?
    operand := literal | path | list | "has" "(" path ")" | "(" expr ")"
    path    := field ( "." ident )*        field: modelType modelName name version spec
                                                  attributes createdAt size
    list    := "[" ( literal ( "," literal )* )? "]"
    literal := "string" | 'string' | number | true | false | null

Parsed once into a tree of closures, then evaluated per record. A missing field never raises: it
is unequal to everything, ordering against it is false, and ``has(path)`` tests for it. Errors
point at the character where parsing stopped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from swamp.errors import InvalidPredicate, UserError

FIELDS = ("modelType", "modelName", "name", "version", "spec", "attributes", "createdAt", "size")
_MISSING = object()

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>-?\d+(?:\.\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>==|!=|<=|>=|&&|\|\||[<>!().,\[\]{}:+?])
  | (?P<ident>[A-Za-z_][A-Za-z0-9_-]*)
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokenize(source: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:
            raise InvalidPredicate(f"unexpected character {source[pos]!r}", source, pos)
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(_Tok(kind, match.group(), pos))
        pos = match.end()
    tokens.append(_Tok("end", "", len(source)))
    return tokens


Evaluator = Callable[[dict], object]


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = _tokenize(source)
        self.index = 0
        self.depth = 0

    @property
    def tok(self) -> _Tok:
        return self.tokens[self.index]

    def fail(self, message: str, tok: _Tok | None = None) -> InvalidPredicate:
        tok = tok or self.tok
        return InvalidPredicate(message, self.source, tok.pos)

    def take(self, text: str) -> bool:
        if self.tok.kind in ("op", "ident") and self.tok.text == text:
            self.index += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.take(text):
            found = repr(self.tok.text) if self.tok.kind != "end" else "the end of the predicate"
            raise self.fail(f"expected {text!r}, found {found}")

    def parse(self) -> Evaluator:
        if self.tok.kind == "end":
            raise self.fail("the predicate is empty")
        node = self.expr()
        if self.tok.kind != "end":
            raise self.fail(f"unexpected {self.tok.text!r}")
        return node

    def expr(self) -> Evaluator:
        # flat lists, not a chain of closures: a long a || b || c … evaluates without recursion
        terms = [self.and_()]
        while self.take("||"):
            terms.append(self.and_())
        if len(terms) == 1:
            return terms[0]
        return lambda r: any(_truthy(term(r)) for term in terms)

    def and_(self) -> Evaluator:
        terms = [self.unary()]
        while self.take("&&"):
            terms.append(self.unary())
        if len(terms) == 1:
            return terms[0]
        return lambda r: all(_truthy(term(r)) for term in terms)

    def nested(self) -> None:
        """Count one level of ``(``, ``[`` or ``!``; a predicate nested deeper is refused
        (rather than exhausting the parser's stack)."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"the predicate is nested more than {MAX_NESTING} levels deep")

    def unary(self) -> Evaluator:
        if self.take("!"):
            self.nested()
            inner = self.unary()
            self.depth -= 1
            return lambda r: not _truthy(inner(r))
        return self.compare()

    def compare(self) -> Evaluator:
        left = self.operand()
        tok = self.tok
        if tok.kind == "op" and tok.text in _COMPARATORS:
            self.index += 1
            right = self.operand()
            fn = _COMPARATORS[tok.text]
            return lambda r: fn(left(r), right(r))
        if tok.kind == "ident" and tok.text == "in":
            self.index += 1
            right = self.operand()
            return lambda r: _contains(right(r), left(r))
        return left

    def operand(self) -> Evaluator:
        tok = self.tok
        if tok.kind == "end":
            raise self.fail("the predicate ends where a value was expected")
        if tok.kind == "number":
            self.index += 1
            value = float(tok.text) if "." in tok.text else int(tok.text)
            return lambda r: value
        if tok.kind == "string":
            self.index += 1
            text = _unquote(tok.text)
            return lambda r: text
        if self.take("("):
            self.nested()
            inner = self.expr()
            self.expect(")")
            self.depth -= 1
            return inner
        if self.take("["):
            self.nested()
            items = []
            if not self.take("]"):
                while True:
                    items.append(self.operand())
                    if self.take("]"):
                        break
                    self.expect(",")
            self.depth -= 1
            return lambda r: [item(r) for item in items]
        if tok.kind == "ident":
            if tok.text in ("true", "false", "null"):
                self.index += 1
                value = {"true": True, "false": False, "null": None}[tok.text]
                return lambda r: value
            if tok.text == "has":
                self.index += 1
                self.expect("(")
                path = self.path()
                self.expect(")")
                return lambda r: _lookup(r, path) is not _MISSING
            path = self.path()
            return lambda r: _lookup(r, path)
        raise self.fail(f"unexpected {tok.text!r} where a value was expected")

    def path(self) -> tuple[str, ...]:
        tok = self.tok
        if tok.kind != "ident":
            raise self.fail("expected a field name")
        if tok.text not in FIELDS:
            raise self.fail(f"unknown field {tok.text!r} (fields: {', '.join(FIELDS)})")
        self.index += 1
        parts = [tok.text]
        while self.take("."):
            if self.tok.kind != "ident":
                raise self.fail("expected a name after '.'")
            parts.append(self.tok.text)
            self.index += 1
        return tuple(parts)


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _lookup(record: dict, path: tuple[str, ...]) -> object:
    value: object = record
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _truthy(value: object) -> bool:
    return value is True


def _ordered(op: Callable[[object, object], bool]) -> Callable[[object, object], bool]:
    def compare(a: object, b: object) -> bool:
        if a is _MISSING or b is _MISSING:
            return False
        numbers = (int, float)
        if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
            return op(a, b)
        if isinstance(a, str) and isinstance(b, str):
            return op(a, b)
        return False

    return compare


def _equal(a: object, b: object) -> bool:
    if a is _MISSING or b is _MISSING:
        return False
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _contains(container: object, item: object) -> bool:
    if item is _MISSING:
        return False
    if isinstance(container, list):
        return any(_equal(item, x) for x in container)
    if isinstance(container, dict):
        return isinstance(item, str) and item in container
    if isinstance(container, str):
        return isinstance(item, str) and item in container
    return False


_COMPARATORS: dict[str, Callable[[object, object], bool]] = {
    "==": _equal,
    "!=": lambda a, b: not _equal(a, b),
    "<": _ordered(lambda a, b: a < b),
    "<=": _ordered(lambda a, b: a <= b),
    ">": _ordered(lambda a, b: a > b),
    ">=": _ordered(lambda a, b: a >= b),
}


@dataclass(frozen=True)
class Predicate:
    """A parsed predicate: call ``matches(record)``; ``equalities`` help the store pre-filter."""

    source: str
    evaluate: Evaluator
    equalities: dict[str, str]

    def matches(self, record: dict) -> bool:
        return _truthy(self.evaluate(record))


MAX_PREDICATE_LENGTH = 4096
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_NESTING = 32


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
    evaluate = _Parser(source).parse()
    return Predicate(source=source, evaluate=evaluate, equalities=_top_equalities(source))


def _top_equalities(source: str) -> dict[str, str]:
    """``field == "literal"`` terms joined only by ``&&`` at the top level (for SQL pre-filters).

    Conservative: any ``||``, ``!`` or parenthesis anywhere disables the pre-filter entirely.
    """
    tokens = _tokenize(source)
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
            found[a.text] = _unquote(b.text)
    return found
