"""bench/pickling.py: xr's pickling of a put's Raft messages against pysyncobj's, in one run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench._script import run_script


def test_both_sides_are_timed_and_the_ratio_is_xrs_over_pysyncobjs(tmp_path: Path) -> None:
    ran = run_script(
        "pickling.py", "--puts", "200", "--rounds", "2", "--json", str(tmp_path / "p.json")
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith("round 1/2: xr ") and lines[1].startswith("round 2/2: xr ")
    figures = json.loads(lines[-1])
    assert figures == json.loads((tmp_path / "p.json").read_text())
    assert (figures["benchmark"], figures["puts"], figures["rounds"]) == ("pickling", 200, 2)
    assert figures["xr_us_per_put"] > 0 and figures["pysyncobj_us_per_put"] > 0
    assert figures["ratio"] > 0
    assert f"xr / pysyncobj: {figures['ratio']:.2f}x" in ran.stdout
