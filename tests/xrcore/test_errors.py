"""Proves the error catalogue is a sound contract between servers and clients.

Every error class in `xrcore.errors` is in `CATALOGUE` under a code of its own, answers with an
HTTP error status, and says whether its failure is definite. A code sent over the wire comes back
as the same class with `error_from_code`; a code this version does not know comes back as a plain,
indefinite `XrError`, because a client cannot know that an unknown failure changed nothing.
Errors whose outcome is unknown (timeouts, lost leaders) are indefinite.
"""

from __future__ import annotations

import re

import pytest

from xrcore import errors
from xrcore.errors import (
    CATALOGUE,
    ClusterUnavailable,
    CodecError,
    InvalidArgument,
    LeaderChanged,
    Overloaded,
    PayloadTooLarge,
    RequestTooOld,
    Timeout,
    UnknownOutcome,
    UnsupportedVersion,
    XrError,
    error_from_code,
)

# Lower-case words joined by dots, so that codes read the same in logs, JSON and client code.
CODE_PATTERN = re.compile(r"[a-z][a-z_]*(\.[a-z][a-z_]*)*")

DEFINED_CLASSES = sorted(
    (
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, XrError)
    ),
    key=lambda cls: cls.__name__,
)
CATALOGUED_CLASSES = sorted(CATALOGUE.values(), key=lambda cls: cls.__name__)


def test_catalogue__holds_every_error_class_defined_in_the_module() -> None:
    assert CATALOGUED_CLASSES == DEFINED_CLASSES


def test_catalogue__every_error_class_is_exported() -> None:
    assert {cls.__name__ for cls in DEFINED_CLASSES} <= set(errors.__all__)


def test_catalogue__codes_are_unique() -> None:
    codes = [cls.code for cls in CATALOGUED_CLASSES]
    duplicates = sorted({code for code in codes if codes.count(code) > 1})
    assert not duplicates, f"codes used by more than one class: {duplicates}"


@pytest.mark.parametrize("cls", CATALOGUED_CLASSES, ids=lambda cls: cls.__name__)
def test_catalogue__class_is_filed_under_its_own_well_formed_code(cls: type[XrError]) -> None:
    # A subclass that forgets to set `code` inherits its parent's and shadows it in the catalogue.
    assert "code" in vars(cls), f"{cls.__name__} does not set its own code"
    assert CATALOGUE[cls.code] is cls
    assert CODE_PATTERN.fullmatch(cls.code), cls.code


@pytest.mark.parametrize("cls", CATALOGUED_CLASSES, ids=lambda cls: cls.__name__)
def test_catalogue__http_status_is_an_error_status(cls: type[XrError]) -> None:
    assert type(cls.http_status) is int
    assert 400 <= cls.http_status <= 599


@pytest.mark.parametrize("cls", CATALOGUED_CLASSES, ids=lambda cls: cls.__name__)
def test_catalogue__definite_is_a_bool(cls: type[XrError]) -> None:
    assert type(cls.definite) is bool


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_error_from_code__gives_back_the_same_class(code: str) -> None:
    original = CATALOGUE[code]("the message")
    rebuilt = error_from_code(original.code, original.message)
    assert type(rebuilt) is type(original)
    assert rebuilt.to_dict() == original.to_dict()
    assert str(rebuilt) == "the message"


def test_error_from_code__unknown_code__gives_an_indefinite_xr_error() -> None:
    error = error_from_code("quota.exceeded", "over quota")
    assert type(error) is XrError
    assert error.definite is False
    # The unknown code is kept in the message, so that it is not lost to logs.
    assert "quota.exceeded" in error.message and "over quota" in error.message


def test_to_dict__has_the_wire_fields() -> None:
    error = PayloadTooLarge("key is too long")
    assert error.to_dict() == {
        "code": "limit.payload_too_large",
        "message": "key is too long",
        "definite": True,
    }


@pytest.mark.parametrize(
    "cls",
    [XrError, Timeout, LeaderChanged, UnknownOutcome, RequestTooOld],
    ids=lambda cls: cls.__name__,
)
def test_definite__unknown_outcomes_are_indefinite(cls: type[XrError]) -> None:
    assert cls.definite is False


@pytest.mark.parametrize(
    "cls",
    [CodecError, UnsupportedVersion, InvalidArgument, PayloadTooLarge, Overloaded],
    ids=lambda cls: cls.__name__,
)
def test_definite__requests_rejected_before_proposal_are_definite(cls: type[XrError]) -> None:
    assert cls.definite is True


def test_definite__no_quorum_is_definite_because_nothing_was_proposed() -> None:
    # The catalogue documents this: ClusterUnavailable is raised before proposing, so it is safe
    # to retry; a failure after proposing must be LeaderChanged, Timeout or UnknownOutcome.
    assert ClusterUnavailable.definite is True
    assert ClusterUnavailable.http_status == 503
