"""The one expression language: its tokens, its tree, its parser, its printer, its comparisons.

Record predicates (``data query``, ``swamp.domain.query``) and workflow values (``${{ … }}``,
``swamp.domain.expressions``) are one language read by one parser into one small tree; each has
its own evaluator. A predicate is a :class:`Dialect` of the language (no ``?:``, ``+``, tables,
calls or indexing; a name is a record field), so the two cannot drift apart. The grammar is
written out in ``docs/expressions.md``.

The parser is bounded: an expression's length is checked by the callers (4,096 characters), and
every ``(``, ``[``, ``{``, ``!`` and call counts one level of nesting, refused past
:data:`MAX_NESTING` rather than exhausting the stack. Chains that are not nested (``a || b ||
…``, ``a + b + …``, ``a.b.c…``) are flat in the tree, so evaluating them never recurses deeply.
A parse error is a :class:`ParseError` with the character where parsing stopped; each dialect
words it as its own error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

MAX_LENGTH = 4096  # characters in one expression or predicate
MAX_NESTING = 32

# -- tokens ---------------------------------------------------------------------------------------

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
KEYWORDS = ("true", "false", "null", "has", "in")


@dataclass(frozen=True)
class Token:
    kind: str  # number, string, op, ident, end
    text: str
    pos: int


class ParseError(Exception):
    """Text that is not in the language: ``message`` and the character ``position`` where it
    stopped; ``lexical`` when no token starts there."""

    def __init__(self, message: str, position: int, *, lexical: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        self.lexical = lexical


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:
            raise ParseError(f"unexpected character {source[pos]!r}", pos, lexical=True)
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(Token(kind, match.group(), pos))
        pos = match.end()
    tokens.append(Token("end", "", len(source)))
    return tokens


def unquote(text: str) -> str:
    """The value of a string token (quotes off, escapes undone: an unknown ``\\x`` is ``x``)."""
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


# -- the tree -------------------------------------------------------------------------------------

Value = str | int | float | bool | None


@dataclass(frozen=True)
class Literal:
    value: Value


@dataclass(frozen=True)
class Name:
    """A name: a record field in a predicate, a context name or a builtin in a value."""

    name: str


@dataclass(frozen=True)
class Attr:
    """``.name`` after a value."""

    name: str


@dataclass(frozen=True)
class Item:
    """``[key]`` after a value."""

    key: Node


@dataclass(frozen=True)
class Args:
    """``(a, b)`` after a value: a call."""

    args: tuple[Node, ...]


Suffix = Attr | Item | Args


@dataclass(frozen=True)
class Postfix:
    """A value followed by one or more suffixes, flat: ``a.b[0](x)`` is one node."""

    base: Node
    suffixes: tuple[Suffix, ...]


@dataclass(frozen=True)
class Has:
    """``has(x)``: whether ``x`` is there (a missing field is not an error inside it)."""

    operand: Node


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class And:
    terms: tuple[Node, ...]  # two or more


@dataclass(frozen=True)
class Or:
    terms: tuple[Node, ...]  # two or more


@dataclass(frozen=True)
class Compare:
    op: str  # == != < <= > >= in
    left: Node
    right: Node


@dataclass(frozen=True)
class Add:
    terms: tuple[Node, ...]  # two or more


@dataclass(frozen=True)
class Conditional:
    test: Node
    yes: Node
    no: Node


@dataclass(frozen=True)
class ListOf:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class MapOf:
    pairs: tuple[tuple[Node, Node], ...]


Node = (
    Literal | Name | Postfix | Has | Not | And | Or | Compare | Add | Conditional | ListOf | MapOf
)
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


# -- the parser -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """What one use of the language accepts, and how its errors read."""

    noun: str  # "predicate", "expression": the subject of "the … is empty"
    end_found: str  # what "expected x, found …" says at the end of the text
    too_deep: str  # the nesting error, formatted with ``limit``
    values: bool  # the whole language; otherwise predicates (see the module docstring)
    roots: tuple[str, ...] = ()  # a predicate's names (record fields)


class _Parser:
    """Recursive descent over the tokens; the value grammar counts one level of nesting for
    every expression as well (as it always has: the limits stay where they were)."""

    def __init__(self, source: str, dialect: Dialect) -> None:
        self.tokens = tokenize(source)
        self.dialect = dialect
        self.values = dialect.values
        self.index = 0
        self.depth = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.index]

    def fail(self, message: str) -> ParseError:
        return ParseError(message, self.tok.pos)

    def take(self, text: str) -> bool:
        if self.tok.kind == "op" and self.tok.text == text:
            self.index += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.take(text):
            found = repr(self.tok.text) if self.tok.kind != "end" else self.dialect.end_found
            raise self.fail(f"expected {text!r}, found {found}")

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(self.dialect.too_deep.format(limit=MAX_NESTING))

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise self.fail(f"the {self.dialect.noun} is empty")
        node = self.expr()
        if self.tok.kind != "end":
            raise self.fail(f"unexpected {self.tok.text!r}")
        return node

    def expr(self) -> Node:
        if not self.values:
            return self.or_()
        self.nest()
        node = self.or_()
        if self.take("?"):
            yes = self.expr()
            self.expect(":")
            node = Conditional(node, yes, self.expr())
        self.depth -= 1
        return node

    def or_(self) -> Node:
        terms = [self.and_()]
        while self.take("||"):
            terms.append(self.and_())
        return terms[0] if len(terms) == 1 else Or(tuple(terms))

    def and_(self) -> Node:
        terms = [self.unary()]
        while self.take("&&"):
            terms.append(self.unary())
        return terms[0] if len(terms) == 1 else And(tuple(terms))

    def unary(self) -> Node:
        if self.take("!"):
            self.nest()
            inner = self.unary()
            self.depth -= 1
            return Not(inner)
        return self.compare()

    def compare(self) -> Node:
        side = self.sum if self.values else self.operand
        left = side()
        tok = self.tok
        if (tok.kind == "op" and tok.text in COMPARISONS) or (
            tok.kind == "ident" and tok.text == "in"
        ):
            self.index += 1
            return Compare(tok.text, left, side())
        return left

    def sum(self) -> Node:
        terms = [self.postfix()]
        while self.take("+"):
            terms.append(self.postfix())
        return terms[0] if len(terms) == 1 else Add(tuple(terms))

    def postfix(self) -> Node:
        base = self.operand()
        suffixes: list[Suffix] = []
        while True:
            if self.take("."):
                if self.tok.kind != "ident":
                    raise self.fail("expected a name after '.'")
                suffixes.append(Attr(self.tok.text))
                self.index += 1
            elif self.take("["):
                self.nest()
                key = self.expr()
                self.expect("]")
                self.depth -= 1
                suffixes.append(Item(key))
            elif self.take("("):
                self.nest()
                args = self.items(")")
                self.depth -= 1
                suffixes.append(Args(args))
            else:
                return Postfix(base, tuple(suffixes)) if suffixes else base

    def items(self, close: str) -> tuple[Node, ...]:
        """``a, b, …`` up to ``close`` (a list's items are operands in a predicate)."""
        item = self.expr if self.values else self.operand
        found: list[Node] = []
        if self.take(close):
            return ()
        while True:
            found.append(item())
            if self.take(close):
                return tuple(found)
            self.expect(",")

    def operand(self) -> Node:
        tok = self.tok
        if tok.kind == "end":
            raise self.fail(f"the {self.dialect.noun} ends where a value was expected")
        if tok.kind == "number":
            self.index += 1
            return Literal(float(tok.text) if "." in tok.text else int(tok.text))
        if tok.kind == "string":
            self.index += 1
            return Literal(unquote(tok.text))
        if self.take("("):
            self.nest()
            inner = self.expr()
            self.expect(")")
            self.depth -= 1
            return inner
        if self.take("["):
            self.nest()
            items = self.items("]")
            self.depth -= 1
            return ListOf(items)
        if self.values and self.take("{"):
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
            return MapOf(tuple(pairs))
        if tok.kind == "ident":
            if tok.text in ("true", "false", "null"):
                self.index += 1
                return Literal({"true": True, "false": False, "null": None}[tok.text])
            if tok.text == "has":
                self.index += 1
                self.expect("(")
                inner = self.expr() if self.values else self.path()
                self.expect(")")
                return Has(inner)
            if self.values:
                self.index += 1
                return Name(tok.text)
            return self.path()
        raise self.fail(f"unexpected {tok.text!r} where a value was expected")

    def path(self) -> Node:
        """A predicate's field: a root name, then ``.name`` as often as needed."""
        tok = self.tok
        if tok.kind != "ident":
            raise self.fail("expected a field name")
        if tok.text not in self.dialect.roots:
            fields = ", ".join(self.dialect.roots)
            raise self.fail(f"unknown field {tok.text!r} (fields: {fields})")
        self.index += 1
        names: list[Suffix] = []
        while self.take("."):
            if self.tok.kind != "ident":
                raise self.fail("expected a name after '.'")
            names.append(Attr(self.tok.text))
            self.index += 1
        return Postfix(Name(tok.text), tuple(names)) if names else Name(tok.text)


def parse(source: str, dialect: Dialect) -> Node:
    """The tree of ``source`` in ``dialect``, or :class:`ParseError`. Callers bound the length."""
    return _Parser(source, dialect).parse()


# -- the printer ----------------------------------------------------------------------------------

# how tightly each node binds: a child that binds less tightly than its place needs parentheses
_CONDITIONAL, _OR, _AND, _UNARY, _COMPARE, _SUM, _POSTFIX, _PRIMARY = range(8)


def to_text(node: Node) -> str:
    """Text that parses back to ``node`` (in the dialect it came from)."""
    return _text(node, _CONDITIONAL)


def _binding(node: Node) -> int:
    if isinstance(node, Conditional):
        return _CONDITIONAL
    if isinstance(node, Or):
        return _OR
    if isinstance(node, And):
        return _AND
    if isinstance(node, Not):
        return _UNARY
    if isinstance(node, Compare):
        return _COMPARE
    if isinstance(node, Add):
        return _SUM
    if isinstance(node, Postfix):
        return _POSTFIX
    return _PRIMARY


def _text(node: Node, place: int) -> str:
    text = _bare(node)
    return f"({text})" if _binding(node) < place else text


def _bare(node: Node) -> str:
    if isinstance(node, Literal):
        return _literal(node.value)
    if isinstance(node, Name):
        return node.name
    if isinstance(node, Postfix):
        # a postfix base is a primary: ``(a.b).c`` is two nodes, ``a.b.c`` one
        return _text(node.base, _PRIMARY) + "".join(_suffix(s) for s in node.suffixes)
    if isinstance(node, Has):
        return f"has({_text(node.operand, _CONDITIONAL)})"
    if isinstance(node, Not):
        return "!" + _text(node.operand, _UNARY)
    if isinstance(node, And):
        return " && ".join(_text(t, _UNARY) for t in node.terms)
    if isinstance(node, Or):
        return " || ".join(_text(t, _AND) for t in node.terms)
    if isinstance(node, Compare):
        return f"{_text(node.left, _SUM)} {node.op} {_text(node.right, _SUM)}"
    if isinstance(node, Add):
        return " + ".join(_text(t, _POSTFIX) for t in node.terms)
    if isinstance(node, Conditional):
        return (
            f"{_text(node.test, _OR)} ? {_text(node.yes, _CONDITIONAL)} : "
            f"{_text(node.no, _CONDITIONAL)}"
        )
    if isinstance(node, ListOf):
        # items as operands, so that a predicate's list prints as a predicate's list
        return "[" + ", ".join(_text(i, _SUM) for i in node.items) + "]"
    return "{" + ", ".join(f"{to_text(k)}: {to_text(v)}" for k, v in node.pairs) + "}"


def _suffix(suffix: Suffix) -> str:
    if isinstance(suffix, Attr):
        return "." + suffix.name
    if isinstance(suffix, Item):
        return f"[{to_text(suffix.key)}]"
    return "(" + ", ".join(to_text(a) for a in suffix.args) + ")"


def _literal(value: Value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # digits and one point: the only numbers that lex
        text = format(Decimal(repr(value)), "f")
        return text if "." in text else text + ".0"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t") + '"'


# -- comparisons (the same rules in both evaluators) ----------------------------------------------


class _MissingValue:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: object = _MissingValue()  # a predicate's field that is not there


def truthy(value: object) -> bool:
    """Only ``true`` is true: no truthiness of numbers, strings or lists."""
    return value is True


def equal(a: object, b: object) -> bool:
    """Equality without coercion: a missing value equals nothing, a boolean only a boolean."""
    if a is MISSING or b is MISSING:
        return False
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _ordered(op: Callable[[object, object], bool]) -> Callable[[object, object], bool]:
    def compare(a: object, b: object) -> bool:
        if a is MISSING or b is MISSING:
            return False
        numbers = (int, float)
        if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
            return op(a, b)
        if isinstance(a, str) and isinstance(b, str):
            return op(a, b)
        return False

    return compare


def contains(container: object, item: object) -> bool:
    """``item in container``: in a list (by :func:`equal`), a key of a table, a substring."""
    if item is MISSING:
        return False
    if isinstance(container, list):
        return any(equal(item, x) for x in container)
    if isinstance(container, dict):
        return isinstance(item, str) and item in container
    if isinstance(container, str):
        return isinstance(item, str) and item in container
    return False


COMPARATORS: dict[str, Callable[[object, object], bool]] = {
    "==": equal,
    "!=": lambda a, b: not equal(a, b),
    "<": _ordered(lambda a, b: a < b),  # type: ignore[operator]
    "<=": _ordered(lambda a, b: a <= b),  # type: ignore[operator]
    ">": _ordered(lambda a, b: a > b),  # type: ignore[operator]
    ">=": _ordered(lambda a, b: a >= b),  # type: ignore[operator]
}
