"""xr's pure core: the replicated state machine, its commands, wire format and errors.

Nothing here reads a clock, draws randomness or touches the network or disk (the client
subpackage, added with the node API, is the one exception): applying the same log entries gives
byte-identical state on every replica.
"""

from xrcore import commands, errors
from xrcore.codec import Envelope, decode, decode_snapshot, encode, encode_snapshot
from xrcore.errors import XrError
from xrcore.limits import DEFAULT_LIMITS, Limits
from xrcore.model import Effect, Result, TaskState
from xrcore.state import Applied, StateMachine

__all__ = [
    "DEFAULT_LIMITS",
    "Applied",
    "Effect",
    "Envelope",
    "Limits",
    "Result",
    "StateMachine",
    "TaskState",
    "XrError",
    "commands",
    "decode",
    "decode_snapshot",
    "encode",
    "encode_snapshot",
    "errors",
]
