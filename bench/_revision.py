"""A module of this repository as it was at a git revision, loaded next to the working tree's.

The benchmarks that compare code against an earlier revision in one process (this machine's
speed moves by up to 2x within the hour, so only back-to-back figures compare) load the old
module with `module_at`. It imports the rest of the repository from the working tree, so only
the one module's changes are compared.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

if __name__ == "__main__":
    # Run as a script, a module does nothing or fails on an import: say whose it is.
    print(
        f"{__file__} is a module of bench/audit_log.py, scheduler_pass.py and raft_messages.py, "
        "not a script: run one of those",
        file=sys.stderr,
    )
    raise SystemExit(2)

__all__ = ["ROOT", "module_at"]

ROOT = Path(__file__).resolve().parent.parent


def module_at(revision: str, relative_path: str, folder: Path, *, program: str) -> ModuleType:
    """The file `relative_path` as it was at `revision`, written into `folder` and loaded as a
    module of its own; a revision git cannot read exits with a message naming `program`."""
    try:
        source = subprocess.run(
            ["git", "show", f"{revision}:{relative_path}"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        message = f"{program}: cannot read revision {revision!r}: {detail.strip()}"
        raise SystemExit(message) from None
    stem = Path(relative_path).stem
    path = folder / f"{stem}_at_revision.py"
    path.write_text(source)
    package = ".".join(Path(relative_path).parent.parts)
    spec = importlib.util.spec_from_file_location(f"{package}._{stem}_at_revision", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module
