"""The client library leaves logging to the application: it adds no handler but a NullHandler
and sets no level, so a program that set up no logging prints none of the client's warnings
(found by a QA pass: "no keep-alive of session ... succeeded" on a bare stderr)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import xrcore.client

_CLIENT_SOURCES = Path(xrcore.client.__file__).parent


def test_a_program_without_logging_set_up__prints_no_warning_of_the_client() -> None:
    program = (
        "import logging, xrcore.client\n"
        "logging.getLogger('xr.client').warning('releasing lock failed')\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert finished.stderr == ""


def test_the_client_library__configures_no_logging() -> None:
    for source in sorted(_CLIENT_SOURCES.glob("*.py")):
        text = source.read_text()
        assert "basicConfig" not in text, source
        assert ".setLevel(" not in text, source
        for handler in re.findall(r"addHandler\(([^)]*\))\)", text):
            assert handler == "logging.NullHandler()", (source, handler)
