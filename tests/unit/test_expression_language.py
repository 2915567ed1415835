"""The one expression language: its grammar fuzzed, and its two evaluators held to the old ones.

Trees generated from the grammar print and parse back to themselves; arbitrary text never raises
anything but the language's own errors; and record predicates and workflow values agree with the
two grammars the language replaced (``tests/unit/legacy_language``) on value and on error.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from swamp.domain import expressions, query
from swamp.domain.language import (
    COMPARISONS,
    KEYWORDS,
    MAX_NESTING,
    Add,
    And,
    Args,
    Attr,
    Compare,
    Conditional,
    Has,
    Item,
    ListOf,
    Literal,
    MapOf,
    Name,
    Node,
    Not,
    Or,
    ParseError,
    Postfix,
    parse,
    to_text,
)
from swamp.errors import ExpressionError, InvalidPredicate, UserError
from tests.unit.legacy_language import old_expressions, old_query

# -- generated trees --------------------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,6}", fullmatch=True)
NUMBERS = st.one_of(
    st.integers(-(10**12), 10**12),
    st.builds(lambda a, b: float(f"{a}.{b}"), st.integers(-999, 10**6), st.integers(0, 10**4)),
)
LITERALS = st.builds(Literal, st.one_of(NUMBERS, TEXT, st.booleans(), st.none()))
# the context's names, builtins, and two that are not there
KNOWN = ("inputs", "self", "run", "x", "data", "size", "string", "int", "nope", "nah")
NAMES = st.builds(
    Name, st.one_of(st.sampled_from(KNOWN), IDENT.filter(lambda n: n not in KEYWORDS))
)
ATTRS = st.one_of(st.sampled_from(("n", "s", "l", "m", "k", "x", "y", "id", "latest")), IDENT)


def _pairs(children: st.SearchStrategy[Node], low: int = 2) -> st.SearchStrategy[tuple]:
    return st.lists(children, min_size=low, max_size=3).map(tuple)


def _value_trees(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    suffix = st.one_of(
        st.builds(Attr, ATTRS),
        st.builds(Item, children),
        st.builds(Args, _pairs(children, 0)),
    )
    return st.one_of(
        st.builds(Postfix, children, st.lists(suffix, min_size=1, max_size=3).map(tuple)),
        st.builds(Has, children),
        st.builds(Not, children),
        st.builds(And, _pairs(children)),
        st.builds(Or, _pairs(children)),
        st.builds(Compare, st.sampled_from((*COMPARISONS, "in")), children, children),
        st.builds(Add, _pairs(children)),
        st.builds(Conditional, children, children, children),
        st.builds(ListOf, _pairs(children, 0)),
        st.builds(MapOf, _pairs(st.tuples(children, children), 0)),
    )


VALUE_TREES = st.recursive(st.one_of(LITERALS, NAMES), _value_trees, max_leaves=8)

FIELD = st.sampled_from(query.FIELDS)
PATHS = st.one_of(
    st.builds(Name, FIELD),
    st.builds(
        lambda root, names: Postfix(Name(root), tuple(Attr(n) for n in names)),
        FIELD,
        st.lists(
            st.one_of(st.sampled_from(("exitCode", "tags", "nested", "ok", "x")), IDENT),
            min_size=1,
            max_size=3,
        ),
    ),
)


def _predicate_trees(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    return st.one_of(
        st.builds(Not, children),
        st.builds(And, _pairs(children)),
        st.builds(Or, _pairs(children)),
        st.builds(Compare, st.sampled_from((*COMPARISONS, "in")), children, children),
        st.builds(ListOf, _pairs(children, 0)),
    )


PREDICATE_TREES = st.recursive(
    st.one_of(LITERALS, PATHS, st.builds(Has, PATHS)), _predicate_trees, max_leaves=8
)


def _reparsed(tree: Node, dialect) -> Node:
    text = to_text(tree)
    try:
        again = parse(text, dialect)
    except ParseError as exc:  # a deep tree in few characters: the bound, not the grammar
        assume("nested more than" not in exc.message)
        raise
    assert to_text(again) == text
    return again


@given(VALUE_TREES)
def test_a_value_prints_and_parses_back_to_itself(tree):
    assert _reparsed(tree, expressions.VALUES) == tree


@given(PREDICATE_TREES)
def test_a_predicate_prints_and_parses_back_to_itself(tree):
    assert _reparsed(tree, query.PREDICATES) == tree
    # and it is a predicate to the old grammar too
    assert old_query.parse(to_text(tree)).source == to_text(tree)


# -- arbitrary text ---------------------------------------------------------------------------

TOKENS = (
    *COMPARISONS,
    *KEYWORDS,
    "&&", "||", "!", "?", ":", "+", ".", ",", "(", ")", "[", "]", "{", "}",
    "1", "-2", "0.5", '"a"', "'b\\''", "x", "inputs", "size", "int", "string",
    *query.FIELDS, "attributes.tags", "@", '"open',
)  # fmt: skip
TOKEN_SOUP = st.lists(st.sampled_from(TOKENS), max_size=12).map(" ".join)
ANY_TEXT = st.one_of(st.text(max_size=40), TOKEN_SOUP)

CONTEXT = {
    "inputs": {"n": 2, "s": "eu", "l": [1, "a", True], "m": {"k": None, "x": {"y": 0.5}}},
    "self": {"item": "w1"},
    "run": {"id": "r-1"},
    "x": 1,
    "data": {"latest": lambda model, name: {"model": model, "name": name}},
}
RECORDS = (
    {
        "modelType": "command/shell",
        "modelName": "default",
        "name": "result",
        "version": 3,
        "spec": "result",
        "createdAt": "2026-01-02T00:00:00.000Z",
        "size": 0,
        "attributes": {"exitCode": 1, "tags": ["a", "b"], "nested": {"ok": True}, "x": 0.5},
    },
    {"modelType": "a/b", "name": "x", "version": "3", "attributes": []},
    {},
)


@given(ANY_TEXT)
def test_arbitrary_text_is_a_predicate_or_the_predicate_error(text):
    try:
        predicate = query.parse(text)
    except UserError as exc:  # InvalidPredicate, or the length bound
        assert type(exc) in (InvalidPredicate, UserError)
        return
    for record in RECORDS:
        assert isinstance(predicate.matches(record), bool)


@given(ANY_TEXT)
def test_arbitrary_text_is_a_value_or_the_expression_error(text):
    try:
        expressions.evaluate(text, CONTEXT)
    except ExpressionError:
        pass


# -- the two evaluators agree with the old grammars -------------------------------------------


def _outcome(fn, *args):
    """What a call came to: its value (functions by name), or its error's type and words."""
    try:
        return ("value", _plain(fn(*args)))
    except Exception as exc:  # compared, not swallowed: both sides must match
        return ("error", type(exc).__name__, _plain(str(exc)), getattr(exc, "position", None))


def _plain(value):
    if callable(value):
        return f"<function {getattr(value, '__name__', '?')}>"
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, str):  # a function turned into text has its address in it
        value = re.sub(r" at 0x[0-9a-f]+>", ">", value)
    return (type(value).__name__, value)


def _predicate_outcomes(module, text):
    try:
        predicate = module.parse(text)
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc), getattr(exc, "position", None))
    return ("parsed", predicate.equalities, [predicate.matches(r) for r in RECORDS])


@given(st.one_of(PREDICATE_TREES.map(to_text), ANY_TEXT))
def test_predicates_read_as_they_did(text):
    assert _predicate_outcomes(query, text) == _predicate_outcomes(old_query, text)


@given(st.one_of(VALUE_TREES.map(to_text), ANY_TEXT))
def test_values_come_out_as_they_did(text):
    new = _outcome(expressions.evaluate, text, CONTEXT)
    old = _outcome(old_expressions.evaluate, text, CONTEXT)
    assert new == old


@given(st.one_of(VALUE_TREES.map(to_text), TEXT, ANY_TEXT))
def test_templates_render_as_they_did(text):
    for template in (f"${{{{ {text} }}}}", f"at ${{{{ {text} }}}}!", {"k": [f"${{{{{text}}}}}"]}):
        new = _outcome(expressions.render, template, CONTEXT)
        assert new == _outcome(old_expressions.render, template, CONTEXT)
        new = _outcome(expressions.check_templates, template)
        assert new == _outcome(old_expressions.check_templates, template)


# -- the bounds, and known words --------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "(" * 40 + "1" + ")" * 40,
        "[" * 40 + "]" * 40,
        "!" * 40 + "true",
        "{'a': " * 20 + "1" + "}" * 20,
        "size(" * 20 + "1" + ")" * 20,
        "x" + "[0]" * 40,
        "a ? b : " * 20 + "c",
        "(" * 15 + "1" + ")" * 15,  # 16 levels of parentheses: the value grammar counts 31
        "(" * 16 + "1" + ")" * 16,  # and 33 here
        "[" * 32 + "]" * 32,
        "[" * 33 + "]" * 33,
    ],
)
def test_nesting_is_bounded_where_it_was(text):
    for new, old in (
        (query.parse, old_query.parse),
        (expressions.compile_expression, old_expressions.compile_expression),
    ):
        assert _outcome(_parsed, new, text) == _outcome(_parsed, old, text)


WRAPPERS = {
    "paren": ("(", ")"),
    "list": ("[", "]"),
    "list-item": ("[1, ", "]"),
    "map": ("{'k': ", "}"),
    "not": ("!", ""),
    "index": ("x[", "]"),
    "call": ("size(", ")"),
    "has": ("has(", ")"),
    "ternary": ("true ? ", " : 1"),
    "field": ("(", ").a"),
}


@given(st.lists(st.sampled_from(sorted(WRAPPERS)), min_size=8, max_size=40), st.booleans())
def test_nesting_is_bounded_where_it_was_however_it_nests(wrappers, field):
    """Around the 32-level bound, every way of nesting is refused (or not) exactly as before."""
    text = "attributes.a" if field else "1"
    for name in wrappers:
        before, after = WRAPPERS[name]
        text = before + text + after
    for new, old in (
        (query.parse, old_query.parse),
        (expressions.compile_expression, old_expressions.compile_expression),
    ):
        assert _outcome(_parsed, new, text) == _outcome(_parsed, old, text)


def _parsed(parse_with, text: str) -> None:
    parse_with(text)


def test_length_is_bounded_where_it_was():
    for size in (4096, 4097):
        text = "[" + "1," * ((size - 2) // 2) + "1" * (size % 2) + "]"
        text = text.ljust(size)
        assert len(text) == size
        for new, old in (
            (query.parse, old_query.parse),
            (expressions.compile_expression, old_expressions.compile_expression),
        ):
            assert _outcome(_parsed, new, text) == _outcome(_parsed, old, text)
    assert MAX_NESTING == query.MAX_NESTING == expressions.MAX_NESTING == 32


def test_a_long_field_chain_is_an_error_not_a_crash():
    """``a.b.c…`` is flat in the tree: evaluating 1,500 fields does not exhaust the stack (the
    old value grammar raised RecursionError here)."""
    text = "x" + ".a" * 1500
    with pytest.raises(ExpressionError, match="cannot take field 'a' of a number"):
        expressions.evaluate(text, {"x": 1})
    with pytest.raises(ExpressionError, match="no field 'a'"):
        expressions.evaluate(text, {"x": {}})
    assert query.parse("attributes" + ".a" * 1500).matches(RECORDS[0]) is False


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "the predicate is empty"),
        ("version ==", "the predicate ends where a value was expected"),
        ("(version == 1", "expected ')', found the end of the predicate"),
        ("[1 2]", "expected ',', found '2'"),
        ("foo == 1", "unknown field 'foo' (fields: modelType, modelName, name, version, spec"),
        ("has(1)", "expected a field name"),
        ("attributes.", "expected a name after '.'"),
        ("version + 1", "unexpected '+'"),
        ("{", "unexpected '{' where a value was expected"),
        ("version @ 1", "unexpected character '@'"),
        ("!" * 33 + "true", "the predicate is nested more than 32 levels deep"),
    ],
)
def test_predicate_errors_read_as_documented(text, message):
    with pytest.raises(InvalidPredicate) as info:
        query.parse(text)
    assert message in info.value.message


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "in ${{  }}: the expression is empty (at character 1)"),
        ("1 +", "the expression ends where a value was expected (at character 4)"),
        ("(1", "expected ')', found 'the end' (at character 3)"),
        ("a ? b", "expected ':', found 'the end'"),
        ("{1 2}", "expected ':', found '2'"),
        ("a.", "expected a name after '.' (at character 3)"),
        ("1 2", "unexpected '2' (at character 3)"),
        ("@", "in ${{ @ }}: invalid predicate at position 0: unexpected character '@'"),
        ("[" * 40, "nested more than 32 levels deep"),
        ("nope", "unknown name 'nope' (names here: data, inputs, run, self, x)"),
        ("inputs.zone", "in ${{ inputs.zone }}: no field 'zone'"),
        ("x.y", "cannot take field 'y' of a number"),
        ("inputs.l['a']", "cannot index a list with a string"),
        ("x()", "a number is not a function"),
        ("size(x)", "size() of a number"),
        ("int('z')", "int() of a string 'z'"),
        ("size(1, 2)", "bad arguments"),
        ("1 + 'a'", "cannot add a number, a string"),
        ("{1: 2}", "a map key must be a string"),
        # what is evaluated first names the error
        ("nope in nah", "unknown name 'nah'"),
        ("nope == nah", "unknown name 'nope'"),
        ("nope[nah]", "unknown name 'nope'"),
        ("x[nah]", "unknown name 'nah'"),
        ("x(nah)", "a number is not a function"),
        ("{nope: nah}", "unknown name 'nope'"),
        ("{1: nah}", "a map key must be a string"),
        ("nope + nah", "unknown name 'nope'"),
        ("nope ? nah : 1", "unknown name 'nope'"),
    ],
)
def test_value_errors_read_as_documented(text, message):
    with pytest.raises(ExpressionError) as info:
        expressions.evaluate(text, CONTEXT)
    assert message in info.value.message


@pytest.mark.parametrize(
    "text,value",
    [
        ("inputs.n + 1", 3),
        ("inputs.s == 'eu' ? 'near' : 'far'", "near"),
        ("[1, 2] + [3]", [1, 2, 3]),
        ("'a' + string(inputs.n) + string(true)", "a2true"),
        ("{'k': inputs.l[-1], 'm': inputs.m.x['y']}", {"k": True, "m": 0.5}),
        ("size(inputs.l) == 3 && 'a' in inputs.l", True),
        ("has(inputs.m.k) && !has(inputs.m.z) && !has(inputs.l[5])", True),
        ("data.latest('m', run.id)", {"model": "m", "name": "r-1"}),
        ("1 < true", False),
        ("int('7') >= 7.0", True),
        ("inputs.m.k == null", True),
        ("'s' in {'s': 1}", True),
        ('"a\\"b\\n"', 'a"b\n'),
    ],
)
def test_values_evaluate_as_documented(text, value):
    assert expressions.evaluate(text, CONTEXT) == value
