"""Parse one line of spec math into a small syntax tree.

Grammar, lowest precedence first:
    compare := sum (('<' | '<=' | '>' | '>=' | '==' | '!=') sum)?
    sum     := product (('+' | '-') product)*
    product := unary (('*' | '/') unary)*
    unary   := '-' unary | power
    power   := atom ('**' unary)?            # right-associative, -x**2 == -(x**2)
    atom    := number | name | string | name '(' args ')' | '(' compare ')'
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import Location, SpecError


@dataclass(frozen=True)
class Syntax:
    """A syntax-tree node: kind is 'num', 'name', 'str', 'call', 'binary' or 'neg'."""

    kind: str
    value: object  # number, name, string literal, function name or operator
    args: tuple["Syntax", ...]
    column: int  # 1-based column in the expression text


_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<str>\"[^\"]*\"|'[^']*')"
    r"|(?P<op>\*\*|<=|>=|==|!=|[-+*/(),<>]))"
)
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


class _Parser:
    def __init__(self, text: str, where: Location, context: str):
        self.text = text
        self.where = where
        self.context = context
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                column = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
                self.fail(f"unexpected character {text[column - 1]!r}", column)
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind) + 1))
            pos = m.end()
        self.tokens.append(("end", "", len(text) + 1))
        self.i = 0

    def fail(self, message: str, column: int):
        raise SpecError(self.where, f"in {self.context}: {message} (column {column} of `{self.text}`)")

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i]

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def expect(self, text: str) -> None:
        kind, value, column = self.take()
        if value != text:
            found = "the end of the expression" if kind == "end" else f"'{value}'"
            self.fail(f"expected '{text}' but found {found}", column)

    def parse(self) -> Syntax:
        tree = self.compare()
        kind, value, column = self.peek()
        if kind != "end":
            self.fail(f"unexpected '{value}'", column)
        return tree

    def compare(self) -> Syntax:
        left = self.sum()
        kind, value, column = self.peek()
        if kind == "op" and value in COMPARISONS:
            self.take()
            right = self.sum()
            if self.peek()[1] in COMPARISONS:
                self.fail("comparisons cannot be chained", self.peek()[2])
            return Syntax("binary", value, (left, right), column)
        return left

    def sum(self) -> Syntax:
        left = self.product()
        while self.peek()[1] in ("+", "-"):
            _, op, column = self.take()
            left = Syntax("binary", op, (left, self.product()), column)
        return left

    def product(self) -> Syntax:
        left = self.unary()
        while self.peek()[1] in ("*", "/"):
            _, op, column = self.take()
            left = Syntax("binary", op, (left, self.unary()), column)
        return left

    def unary(self) -> Syntax:
        if self.peek()[1] == "-":
            _, _, column = self.take()
            return Syntax("neg", "-", (self.unary(),), column)
        if self.peek()[1] == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> Syntax:
        base = self.atom()
        if self.peek()[1] == "**":
            _, _, column = self.take()
            return Syntax("binary", "**", (base, self.unary()), column)
        return base

    def atom(self) -> Syntax:
        kind, value, column = self.take()
        if kind == "num":
            number = float(value) if any(c in value for c in ".eE") else int(value)
            return Syntax("num", number, (), column)
        if kind == "str":
            return Syntax("str", value[1:-1], (), column)
        if kind == "name":
            if self.peek()[1] != "(":
                return Syntax("name", value, (), column)
            self.take()
            args = []
            if self.peek()[1] != ")":
                args.append(self.compare())
                while self.peek()[1] == ",":
                    self.take()
                    args.append(self.compare())
            self.expect(")")
            return Syntax("call", value, tuple(args), column)
        if value == "(":
            inner = self.compare()
            self.expect(")")
            return inner
        found = "the end of the expression" if kind == "end" else f"'{value}'"
        self.fail(f"expected a value but found {found}", column)


def parse_expression(text: str, where: Location, context: str) -> Syntax:
    """Parse `text`; errors read `file:line: in <context>: <problem> (column c of `text`)`."""
    return _Parser(text, where, context).parse()
