"""Errors that point at the spec: every message starts with `file:line:`."""
from __future__ import annotations


class SpecError(Exception):
    """A problem in a spec file, reported as `specs/<file>.yaml:<line>: <message>`."""

    def __init__(self, where: "Location | None", message: str):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class Location:
    """A position in a spec file (1-based line)."""

    __slots__ = ("path", "line")

    def __init__(self, path: str, line: int):
        self.path = path
        self.line = line

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"

    def __repr__(self) -> str:
        return f"Location({self.path!r}, {self.line})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and (self.path, self.line) == (other.path, other.line)

    def __hash__(self) -> int:
        return hash((self.path, self.line))
