"""Sequential specifications for the linearizability checker: a register and a key-value map.

A model is pure data and functions, in the style of Porcupine: `init()` gives the initial state,
`step(state, input, output)` says whether the operation could return `output` from `state` and
what the state becomes. States must be hashable (the search memoizes on them). `encode` turns a
history operation into `(input, output)`, or None when the operation constrains nothing (a read
whose outcome is unknown). The output of an operation with an unknown outcome is `UNKNOWN`, and
`step` must accept it from every state: such an operation may or may not have taken effect.

Three optional facts make the search faster and the failing windows small:
- `blind(input)`: the step ignores the state entirely (the new state depends on the input alone)
  and always succeeds: a register write. An unknown-outcome operation followed directly by a
  blind one never needs to be tried, because the blind one erases its effect.
- `enabling(input, output)`, for a non-blind operation: the one state its step depends on (a
  read's value, a cas's expected value). The contract: from any other state that a blind
  operation can produce, the step fails (for an operation with a known outcome) or changes
  nothing (for an unknown outcome). Then an unknown-outcome blind operation is only ever worth
  placing right before an operation it enables, which the search finds through an index instead
  of trying every outstanding one.
- `any_state`: a state standing for "any value", from which `step` accepts whatever the first
  observation says. The checker starts windows cut from the middle of a history in it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final

from xr_jepsen.history import Operation

__all__ = ["ANY", "UNKNOWN", "Model", "freeze", "kv", "register"]


class _Marker:
    """A named singleton; compares equal only to itself."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


# The output of an operation whose outcome is unknown (an info op, or one that never returned).
UNKNOWN: Final = _Marker("UNKNOWN")
# A register state that stands for every value.
ANY: Final = _Marker("ANY")


def _never_blind(input: Hashable) -> bool:
    return False


@dataclass(frozen=True, kw_only=True)
class Model:
    """A sequential specification; see the module docstring for what each part must satisfy."""

    name: str
    # The `f`s of the operations the model understands; the checker leaves all others out.
    fs: frozenset[str]
    init: Callable[[], Hashable]
    step: Callable[[Hashable, Hashable, Hashable], tuple[bool, Hashable]]
    encode: Callable[[Operation], tuple[Hashable, Hashable] | None]
    describe: Callable[[Hashable, Hashable], str]
    blind: Callable[[Hashable], bool] = _never_blind
    any_state: Hashable | None = None
    enabling: Callable[[Hashable, Hashable], Hashable] | None = None


def freeze(value: Any) -> Hashable:
    """A hashable copy of a JSON value: lists become tuples, objects sorted tuples of pairs."""
    if isinstance(value, list):
        return tuple(freeze(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((str(name), freeze(item)) for name, item in value.items()))
    if isinstance(value, Hashable):
        return value
    raise ValueError(f"not a JSON value: {value!r}")


# Register inputs are tuples: ("read",), ("write", value), ("cas", expected, new).
def _register_encode(operation: Operation) -> tuple[Hashable, Hashable] | None:
    unknown = operation.type != "ok"
    completion_value = None if operation.completion is None else operation.completion.value
    if operation.f == "read":
        # A read with an unknown outcome observed nothing, so it constrains nothing.
        return None if unknown else (("read",), freeze(completion_value))
    if operation.f == "write":
        return ("write", freeze(operation.invoke.value)), UNKNOWN if unknown else None
    if operation.f == "cas":
        pair = operation.invoke.value
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"cas value must be [expected, new], not {pair!r}")
        return ("cas", freeze(pair[0]), freeze(pair[1])), UNKNOWN if unknown else True
    raise ValueError(f"the register model has no operation {operation.f!r}")


# Typed Any, not Hashable: the search calls this millions of times, too often for isinstance.
def _register_step(state: Any, input: Any, output: Any) -> tuple[bool, Hashable]:
    kind = input[0]
    if kind == "read":
        if state is ANY:
            return True, output
        return state == output, state
    if kind == "write":
        return True, input[1]
    expected, new = input[1], input[2]
    if output is UNKNOWN:
        if state is ANY:
            # Swapped or not: "any value" covers both, which only ever errs towards legal.
            return True, ANY
        return True, new if state == expected else state
    if state is ANY or state == expected:
        return True, new
    return False, state


def _register_describe(input: Hashable, output: Hashable) -> str:
    assert isinstance(input, tuple)
    if input[0] == "read":
        return f"read -> {output!r}"
    if input[0] == "write":
        return f"write {input[1]!r}"
    outcome = "unknown" if output is UNKNOWN else "ok"
    return f"cas {input[1]!r} -> {input[2]!r} ({outcome})"


def _register_blind(input: Hashable) -> bool:
    return isinstance(input, tuple) and input[0] == "write"


def _register_enabling(input: Any, output: Any) -> Any:
    # A read depends on the value it returned; a cas (known or unknown outcome) on its expected.
    return output if input[0] == "read" else input[1]


register: Final = Model(
    name="register",
    fs=frozenset({"read", "write", "cas"}),
    init=lambda: None,
    step=_register_step,
    encode=_register_encode,
    describe=_register_describe,
    blind=_register_blind,
    any_state=ANY,
    enabling=_register_enabling,
)
"""A single register holding a JSON value, initially None (null).

`read`: ok value is the value read (None when never written). `write`: invoke value v.
`cas`: invoke value [expected, new]; ok means it swapped, fail means it did not (a failed cas has
no effect, so the checker drops it like every fail).
"""


# A kv state is (default, pairs): the register state of keys not in `pairs` (None at the start,
# ANY in a window), and the sorted (key, register state) pairs of the others.
def _kv_encode(operation: Operation) -> tuple[Hashable, Hashable] | None:
    encoded = _register_encode(operation)
    if encoded is None:
        return None
    return (operation.key, encoded[0]), encoded[1]


def _kv_step(state: Hashable, input: Hashable, output: Hashable) -> tuple[bool, Hashable]:
    assert isinstance(state, tuple) and isinstance(input, tuple)
    default, pairs = state
    key, register_input = input
    values = dict(pairs)
    ok, new = _register_step(values.get(key, default), register_input, output)
    if not ok:
        return False, state
    values[key] = new
    return True, (default, tuple(sorted(values.items(), key=lambda item: str(item[0]))))


def _kv_describe(input: Hashable, output: Hashable) -> str:
    assert isinstance(input, tuple)
    return f"key {input[0]!r}: {_register_describe(input[1], output)}"


kv: Final = Model(
    name="kv",
    fs=register.fs,
    init=lambda: (None, ()),
    step=_kv_step,
    encode=_kv_encode,
    describe=_kv_describe,
    # Not blind: a write's new state keeps the other keys' values, so it depends on the state.
    any_state=(ANY, ()),
)
"""A map of registers, one per `key`, for checking a whole history as one object
(`per_key=False`); per key it behaves exactly like `register`."""
