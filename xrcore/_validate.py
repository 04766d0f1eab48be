"""Type and bounds checks shared by every wire struct (commands, queries, job specs).

msgspec checks types when it decodes bytes, but not when Python code builds a struct directly, so
every wire struct runs the same checks in `__post_init__`: a struct that exists is well-formed,
however it was made. Checkers are derived once per class from its type hints.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from xrcore.errors import InvalidArgument, PayloadTooLarge
from xrcore.limits import RANGE_LIMIT_MAX

__all__ = [
    "NAME_PATTERN",
    "WireStruct",
    "check_bytes",
    "check_name",
    "check_page_limit",
    "check_range",
    "check_text",
]

Checker = Callable[[str, Any], None]

# Names of regions, locks, tenants and similar: printable, no spaces, no path tricks.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]*")
NAME_BYTES_MAX = 128


def _fail(field: str, expected: str, value: Any) -> None:
    raise InvalidArgument(f"{field} must be {expected}, got {type(value).__name__} {value!r:.80}")


# msgpack writes integers from -2**63 to 2**64 - 1; a struct must be encodable, so a larger one
# (JSON and query strings carry any size) is refused here and not by the encoder later.
INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1


def _check_int(field: str, value: Any) -> None:
    if type(value) is not int:
        _fail(field, "an integer", value)
    if not INT_MIN <= value <= INT_MAX:
        raise InvalidArgument(f"{field} must be between {INT_MIN} and {INT_MAX}, got {value}")


def _check_float(field: str, value: Any) -> None:
    if type(value) is not float:
        _fail(field, "a float", value)
    if not math.isfinite(value):
        raise InvalidArgument(f"{field} must be finite, got {value!r}")


def _simple(kind: type) -> Checker:
    def check(field: str, value: Any) -> None:
        if type(value) is not kind:
            _fail(field, f"of type {kind.__name__}", value)

    return check


def _optional(inner: Checker) -> Checker:
    def check(field: str, value: Any) -> None:
        if value is not None:
            inner(field, value)

    return check


def _tuple_of(inner: Checker) -> Checker:
    def check(field: str, value: Any) -> None:
        if type(value) is not tuple:
            _fail(field, "a tuple", value)
        for position, item in enumerate(value):
            inner(f"{field}[{position}]", item)

    return check


def _mapping_of(inner: Checker) -> Checker:
    def check(field: str, value: Any) -> None:
        # Exactly dict: the encoder writes dicts, not arbitrary mappings.
        if type(value) is not dict:
            _fail(field, "a dict", value)
        for key, item in value.items():
            if type(key) is not str:
                _fail(f"{field} key", "a string", key)
            inner(f"{field}[{key!r}]", item)

    return check


def _struct(kind: type) -> Checker:
    def check(field: str, value: Any) -> None:
        if not isinstance(value, kind):
            _fail(field, f"a {kind.__name__}", value)

    return check


def _checker_for(hint: Any) -> Checker:
    origin = typing.get_origin(hint)
    if hint is int:
        return _check_int
    if hint is float:
        return _check_float
    if hint in (str, bytes, bool):
        return _simple(hint)
    if origin in (types.UnionType, typing.Union):
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(members) != 1:
            raise TypeError(f"unsupported union {hint!r}")
        return _optional(_checker_for(members[0]))
    if origin is tuple:
        item, ellipsis = typing.get_args(hint)
        assert ellipsis is Ellipsis, hint
        return _tuple_of(_checker_for(item))
    if origin in (dict, Mapping):
        key, item = typing.get_args(hint)
        assert key is str, hint
        return _mapping_of(_checker_for(item))
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return _struct(hint)
    raise TypeError(f"unsupported field type {hint!r}")


_CHECKERS: dict[type, tuple[tuple[str, Checker], ...]] = {}


def _checkers(cls: type) -> tuple[tuple[str, Checker], ...]:
    found = _CHECKERS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        names: tuple[str, ...] = cls.__struct_fields__  # type: ignore[attr-defined]
        found = tuple((name, _checker_for(hints[name])) for name in names)
        _CHECKERS[cls] = found
    return found


class WireStruct(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A frozen, keyword-only struct that checks its field types and then its own rules."""

    def __post_init__(self) -> None:
        for name, check in _checkers(type(self)):
            check(name, getattr(self, name))
        self.validate()

    def validate(self) -> None:
        """Rules beyond types; subclasses override and raise `InvalidArgument`."""


def _utf8_size(field: str, value: str) -> int:
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"{field} is not valid UTF-8 (it has a lone surrogate)") from None


def check_bytes(field: str, value: str | bytes, maximum: int, *, empty: bool = False) -> None:
    size = _utf8_size(field, value) if isinstance(value, str) else len(value)
    if size > maximum:
        raise PayloadTooLarge(f"{field} is {size} bytes, more than the maximum of {maximum}")
    if size == 0 and not empty:
        raise InvalidArgument(f"{field} must not be empty")


def check_text(field: str, value: str, maximum: int) -> None:
    check_bytes(field, value, maximum, empty=True)


def check_name(field: str, value: str) -> None:
    check_bytes(field, value, NAME_BYTES_MAX)
    if NAME_PATTERN.fullmatch(value) is None:
        raise InvalidArgument(
            f"{field} {value!r} must start with a letter or digit and contain only letters, "
            "digits and . _ : @ / -"
        )


def check_page_limit(limit: int) -> None:
    """A page of keys, events or jobs holds 1 to RANGE_LIMIT_MAX items."""
    check_range("limit", limit, 1, RANGE_LIMIT_MAX)


def check_range(field: str, value: int | float, low: int | float, high: int | float) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{field} must be between {low} and {high}, got {value}")
