"""The report of one run: a self-contained HTML page (inline CSS and SVG, no external assets).

It shows the verdicts, the seed and the command to replay the run, the mechanisms used, how many
faults were injected (with a warning when a nemesis injected none, or when SIGTERM stopped the
run early: the verdict then covers less than was asked for), and a timeline: one lane per client
worker (operations as bars from invoke to completion, coloured by outcome: ok, fail, info), the
protected resource's lane, the nemesis windows shaded, the failing window (if a checker found
one) outlined in red, and one lane per node with its role and term over time as polled from
`GET /v1/cluster/status`.

Built from the run directory's files alone, so `xr-jepsen report RUN_DIR` can rebuild it.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.files import TooLarge, read_bounded
from xr_jepsen.generator import FINAL_PROCESS
from xr_jepsen.history import HistoryError, Op, Operation, is_nemesis, pair, read_history
from xr_jepsen.resource import RESOURCE_PROCESS
from xr_jepsen.runner import faults_injected, no_fault_warning

__all__ = ["ReportError", "render_report", "write_report"]

WIDTH_PX = 1200
LABEL_PX = 90
LANE_PX = 14
NODE_LANE_PX = 18
TERM_GAP_PX = 22
COLOURS = {"ok": "#3a9d5d", "fail": "#d9534f", "info": "#f0ad4e"}
ROLE_COLOURS = {
    "leader": "#6f42c1",
    "follower": "#8fb3d9",
    "candidate": "#f7d154",
    "down": "#333333",
}
# Bars beyond this are left out of the picture (the history file has them all).
BARS_MAX = 40_000
# results.json and status.jsonl: far less than this in any run (an endless file is refused).
FILE_BYTES_MAX = 64 << 20
# Time labels along the axis: one every 5 s, further apart when there would be more than this.
TIME_LABELS_MAX = 1000
ANOMALIES_SHOWN_MAX = 50

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 8px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 4px; color: white; }
.valid { background: #3a9d5d; } .invalid { background: #d9534f; }
.unknown, .not-live { background: #f0ad4e; }
table { border-collapse: collapse; } td, th { padding: 2px 10px 2px 0; text-align: left; }
code, pre { background: #f4f4f4; padding: 2px 4px; }
.warning { background: #fcf3e0; border-left: 4px solid #f0ad4e; padding: 4px 8px; }
pre { padding: 8px; overflow-x: auto; }
.legend span { display: inline-block; margin-right: 14px; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: middle;
  margin-right: 4px; }
svg text { font: 11px system-ui, sans-serif; }
"""


class ReportError(ValueError):
    """A run directory whose files cannot make a report: missing, unreadable or malformed."""


@dataclass(frozen=True)
class _Scale:
    end_ns: int

    def x(self, time_ns: int) -> float:
        span = max(self.end_ns, 1)
        return LABEL_PX + (WIDTH_PX - LABEL_PX - 10) * min(max(time_ns, 0), span) / span


def _e(value: Any) -> str:
    return html.escape(str(value))


def _lane_of(operation: Operation, workers: int) -> str:
    process = operation.process
    if process == RESOURCE_PROCESS:
        return "resource"
    if process >= FINAL_PROCESS:
        return "final"
    return f"worker {process % workers}"


def _nemesis_windows(ops: list[Op], end_ns: int) -> list[tuple[int, int, str]]:
    """(start, end, label) of each fault, pairing each start with the next heal of that fault."""
    open_faults: list[tuple[int, str]] = []
    windows: list[tuple[int, int, str]] = []
    for op in ops:
        if not is_nemesis(op) or not isinstance(op.value, dict):
            continue
        phase, fault = op.value.get("phase"), str(op.value.get("fault"))
        nodes = op.value.get("nodes")
        nodes = ",".join(map(str, nodes)) if isinstance(nodes, list) else ""
        if phase == "start":
            open_faults.append((op.time_ns, f"{fault} {nodes}".strip()))
        elif phase == "heal" and open_faults:
            if fault == "all":
                windows.extend((start, op.time_ns, label) for start, label in open_faults)
                open_faults = []
            else:
                start, label = open_faults.pop(0)
                windows.append((start, op.time_ns, label))
    windows.extend((start, end_ns, label) for start, label in open_faults)
    return windows


def _timeline(
    ops: list[Op], statuses: list[dict[str, Any]], window: list[int] | None, workers: int
) -> str:
    end_ns = max([op.time_ns for op in ops] + [entry["time_ns"] for entry in statuses] + [1])
    scale = _Scale(end_ns)
    operations = pair(ops)
    lanes = sorted(
        {_lane_of(operation, workers) for operation in operations},
        key=lambda name: (not name.startswith("worker"), len(name), name),
    )
    nodes = sorted({entry["node"] for entry in statuses})
    top = 24
    lane_y = {name: top + position * LANE_PX for position, name in enumerate(lanes)}
    nodes_top = top + len(lanes) * LANE_PX + 16
    node_y = {name: nodes_top + position * NODE_LANE_PX for position, name in enumerate(nodes)}
    height = nodes_top + len(nodes) * NODE_LANE_PX + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}">']
    for position, (start, stop, label) in enumerate(_nemesis_windows(ops, end_ns)):
        x0, x1 = scale.x(start), scale.x(stop)
        parts.append(
            f'<rect x="{x0:.1f}" y="0" width="{max(x1 - x0, 1):.1f}" height="{height - 20}" '
            f'fill="#999" fill-opacity="0.18"><title>{_e(label)}</title></rect>'
        )
        # The fault's name only (its nodes are in the tooltip), on alternating rows.
        name = label.split(" ")[0].removeprefix("partition-")
        row_y = 9 if position % 2 == 0 else 19
        parts.append(f'<text x="{x0 + 2:.1f}" y="{row_y}" fill="#555">{_e(name)}</text>')
    for name, y in lane_y.items():
        parts.append(f'<text x="4" y="{y + LANE_PX - 4}">{_e(name)}</text>')
    for operation in operations[:BARS_MAX]:
        start_ns = operation.invoke.time_ns
        stop_ns = end_ns if operation.completion is None else operation.completion.time_ns
        x0, x1 = scale.x(start_ns), scale.x(stop_ns)
        y = lane_y[_lane_of(operation, workers)]
        title = f"{operation.f} {operation.key or ''} {json.dumps(operation.value)[:80]} -> "
        title += operation.type
        if operation.completion is not None and operation.completion.error:
            title += f" ({operation.completion.error})"
        parts.append(
            f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(x1 - x0, 1.5):.1f}" '
            f'height="{LANE_PX - 4}" fill="{COLOURS[operation.type]}">'
            f"<title>{_e(title)}</title></rect>"
        )
    parts.extend(_node_lanes(statuses, node_y, scale))
    if window is not None:
        times = {op.index: op.time_ns for op in ops}
        first, last = times.get(window[0], 0), times.get(window[1], end_ns)
        x0, x1 = scale.x(first), scale.x(last)
        parts.append(
            f'<rect x="{x0:.1f}" y="16" width="{max(x1 - x0, 2):.1f}" height="{height - 40}" '
            f'fill="#d9534f" fill-opacity="0.12" stroke="#d9534f" stroke-width="2">'
            f"<title>failing window: ops {window[0]} to {window[1]}</title></rect>"
        )
    end_s = int(end_ns / 1e9)
    for second in range(0, end_s + 1, 5 * max(1, math.ceil(end_s / 5 / TIME_LABELS_MAX))):
        x = scale.x(int(second * 1e9))
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" fill="#555">{second} s</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _node_lanes(statuses: list[dict[str, Any]], node_y: dict[str, int], scale: _Scale) -> list[str]:
    parts: list[str] = []
    # Drawn after every bar, so no later bar covers a label.
    labels: list[str] = []
    by_node: dict[str, list[dict[str, Any]]] = {}
    for entry in statuses:
        by_node.setdefault(entry["node"], []).append(entry)
    for node, entries in by_node.items():
        y = node_y[node]
        parts.append(f'<text x="4" y="{y + NODE_LANE_PX - 5}">node {_e(node)}</text>')
        last_term, last_label_x = None, -float(TERM_GAP_PX)
        for position, entry in enumerate(entries):
            stop_ns = entries[position + 1]["time_ns"] if position + 1 < len(entries) else None
            if stop_ns is None:
                stop_ns = entry["time_ns"] + 500_000_000
            role = str(entry.get("state") or "down")
            x0, x1 = scale.x(entry["time_ns"]), scale.x(stop_ns)
            title = f"{node}: {role}, term {entry.get('term')}, leader {entry.get('leader')}"
            parts.append(
                f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(x1 - x0, 1):.1f}" '
                f'height="{NODE_LANE_PX - 4}" fill="{ROLE_COLOURS.get(role, "#bbb")}">'
                f"<title>{_e(title)}</title></rect>"
            )
            term = entry.get("term")
            # A term is written where it changes, unless the previous label is too close.
            if term is not None and term != last_term and x0 >= last_label_x + TERM_GAP_PX:
                labels.append(
                    f'<text x="{x0 + 1:.1f}" y="{y + NODE_LANE_PX - 5}" fill="white">'
                    f"{_e(term)}</text>"
                )
                last_term, last_label_x = term, x0
    return parts + labels


def _legend() -> str:
    items = [(colour, name) for name, colour in COLOURS.items()]
    items += [(colour, f"node {role}") for role, colour in ROLE_COLOURS.items()]
    items += [("#999", "fault window"), ("#d9534f", "failing window (outlined)")]
    return (
        '<p class="legend">'
        + "".join(
            f'<span><span class="swatch" style="background:{colour}"></span>{_e(name)}</span>'
            for colour, name in items
        )
        + "</p>"
    )


def _warnings(results: dict[str, Any], faults: int) -> list[str]:
    """What the verdict does not cover: a run SIGTERM cut short, a nemesis that did nothing."""
    warnings = []
    if results.get("stopped_by"):
        warnings.append(
            f"stopped early by {results['stopped_by']}: the verdict covers only what ran"
        )
    no_fault = no_fault_warning(str(results.get("nemesis", "none")), faults)
    if no_fault is not None:
        warnings.append(no_fault)
    return warnings


def render_report(
    results: dict[str, Any], ops: list[Op], statuses: list[dict[str, Any]], *, workers: int
) -> str:
    check = results.get("check", {})
    verdict = str(results.get("verdict", "unknown"))
    # Counted from the events when results.json predates the count.
    faults = results.get("faults")
    if not isinstance(faults, int) or isinstance(faults, bool):
        faults = faults_injected(results.get("nemesis_events", []))
    rows = [
        ("workload", results.get("workload")),
        ("nemesis", results.get("nemesis")),
        ("nodes", results.get("nodes")),
        ("seed", results.get("seed")),
        ("duration", f"{results.get('time_s')} s of workload"),
        ("faults injected", faults),
        ("operations", json.dumps(results.get("ops"))),
        ("safety", check.get("valid")),
        ("liveness", json.dumps(results.get("liveness"))),
        ("anomalies", results.get("anomalies")),
        ("partitions", results.get("mechanism", {}).get("partitions")),
        ("clock faults", results.get("mechanism", {}).get("clock")),
        ("timings", json.dumps(results.get("timings_s"))),
        ("deliberate bugs on", ", ".join(results.get("test_faults", [])) or "none"),
    ]
    table = "".join(f"<tr><th>{_e(name)}</th><td>{_e(value)}</td></tr>" for name, value in rows)
    anomalies = check.get("anomalies", [])[:ANOMALIES_SHOWN_MAX]
    anomaly_items = "".join(
        f"<li><b>{_e(item.get('kind'))}</b>: {_e(item.get('message'))} "
        f"(ops {_e(item.get('ops'))})</li>"
        for item in anomalies
    )
    nemesis_items = "".join(
        f"<li>{_e(json.dumps(event))}</li>" for event in results.get("nemesis_events", [])
    )
    window = check.get("window")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>xr-jepsen: {_e(results.get("workload"))} / {_e(results.get("nemesis"))}</title>
<style>{_STYLE}</style></head><body>
<h1>xr-jepsen: {_e(results.get("workload"))} under {_e(results.get("nemesis"))}
<span class="verdict {_e(verdict.replace(" ", "-"))}">{_e(verdict)}</span></h1>
{"".join(f'<p class="warning">{_e(line)}</p>' for line in _warnings(results, faults))}
<p>Replay: <code>{_e(results.get("command"))}</code></p>
<p>{_e(results.get("reproducibility"))}</p>
<table>{table}</table>
<h2>Checker</h2>
<p>{_e(check.get("checker"))}: {_e(check.get("message"))}</p>
{f"<ul>{anomaly_items}</ul>" if anomaly_items else "<p>No anomalies.</p>"}
{f"<p>Failing window: history ops {_e(window[0])} to {_e(window[1])}.</p>" if window else ""}
<h2>Timeline</h2>
{_legend()}
{_timeline(ops, statuses, window, workers)}
<h2>Faults</h2>
<ul>{nemesis_items or "<li>none</li>"}</ul>
<p>Mechanism: {_e(results.get("mechanism", {}).get("note"))}</p>
</body></html>
"""


def _read_text(path: Path) -> str:
    try:
        return read_bounded(path, FILE_BYTES_MAX).decode("utf-8")
    except TooLarge:
        raise ReportError(f"{path.name} is larger than {FILE_BYTES_MAX} bytes") from None
    except FileNotFoundError:
        raise ReportError(f"no {path.name} (is it a run directory?)") from None
    except OSError as error:
        raise ReportError(f"cannot read {path.name}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path.name} is not UTF-8 text") from None


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ReportError(f"{where}: not JSON: {error}") from None
    except RecursionError:
        raise ReportError(f"{where}: not JSON: nested too deeply") from None


def _check_results(results: Any) -> None:
    """Refuses a results.json without the shape `render_report` reads."""
    if not isinstance(results, dict):
        raise ReportError("results.json: not a JSON object")
    for name, kind, what in (
        ("check", dict, "an object"),
        ("mechanism", dict, "an object"),
        ("nemesis_events", list, "a list"),
        ("test_faults", list, "a list"),
    ):
        if name in results and not isinstance(results[name], kind):
            raise ReportError(f"results.json: {name} must be {what}")
    check = results.get("check", {})
    anomalies = check.get("anomalies", [])
    if not isinstance(anomalies, list) or not all(isinstance(item, dict) for item in anomalies):
        raise ReportError("results.json: check.anomalies must be a list of objects")
    window = check.get("window")
    if window is not None and not (
        isinstance(window, list) and len(window) == 2 and all(_is_int(item) for item in window)
    ):
        raise ReportError("results.json: check.window must be null or two op indices")
    if not all(isinstance(name, str) for name in results.get("test_faults", [])):
        raise ReportError("results.json: test_faults must be a list of strings")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_statuses(path: Path) -> list[dict[str, Any]]:
    statuses = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line:
            continue
        entry = _json(line, f"{path.name} line {number}")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("node"), str)
            and _is_int(entry.get("time_ns"))
        ):
            raise ReportError(f"{path.name} line {number}: not an object with node and time_ns")
        statuses.append(entry)
    return statuses


def write_report(run_dir: Path) -> Path:
    """Builds `run_dir/report.html` from the run's files; returns its path. Raises ReportError
    for a file that is missing, unreadable or malformed, and OSError when the report cannot be
    written."""
    results = _json(_read_text(run_dir / "results.json"), "results.json")
    _check_results(results)
    try:
        ops = read_history(run_dir / "history.jsonl")
        pair(ops)
    except FileNotFoundError:
        raise ReportError("no history.jsonl (is it a run directory?)") from None
    except OSError as error:
        raise ReportError(f"cannot read history.jsonl: {error.strerror}") from None
    except HistoryError as error:
        raise ReportError(f"history.jsonl: {error}") from None
    statuses = []
    status_path = run_dir / "status.jsonl"
    if status_path.exists():
        statuses = _read_statuses(status_path)
    from xr_jepsen.workloads import make_workload

    try:
        workers = make_workload(str(results.get("workload"))).workers
    except ValueError as error:
        raise ReportError(f"results.json: {error}") from None
    path = run_dir / "report.html"
    if path.exists() and not (path.is_file() or path.is_dir()):
        # Written in place: a pipe would wait for a reader forever. (A directory fails to open.)
        raise ReportError(f"{path.name} exists and is not a regular file")
    path.write_text(render_report(results, ops, statuses, workers=workers))
    return path
