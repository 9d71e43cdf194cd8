"""Text forms of the monitor's reports for the terminal (`jupyter gpujobs usage`, `usage
--heatmap`, `findings`): plain functions over the JSON the API returns, no store, no I/O.
"""

from __future__ import annotations

import time
from typing import Any

SHADES = " ░▒▓█"  # 0-20, 20-40, 40-60, 60-80, 80-100 %



def format_usage(report: dict[str, Any]) -> str:
    """The usage report as a terminal table."""
    by = report["by"].upper()
    rows = report["rows"]
    total = report["total_gpu_hours"] or 0.0
    lines = [f"GPU-hours by {report['by']}, {_stamp(report['since'])} - {_stamp(report['until'])}"]
    width = max([len(by)] + [len(str(r["key"])) for r in rows])
    lines.append(f"{by:<{width}}  {'GPU-HOURS':>10}  {'SHARE':>6}  {'JOBS':>5}")
    for r in rows:
        share = r["gpu_hours"] / total if total else 0.0
        lines.append(f"{str(r['key']):<{width}}  {r['gpu_hours']:>10.2f}  {share:>6.1%}  {r['jobs']:>5}")
    lines.append(f"{'total':<{width}}  {total:>10.2f}")
    return "\n".join(lines)


def shade(value: float | None) -> str:
    if value is None:
        return "·"
    return SHADES[min(len(SHADES) - 1, int(max(0.0, value) / 20.0))]


def format_heatmap(report: dict[str, Any]) -> str:
    """The heatmap as a grid: weekdays down, local hours across, two shading characters a cell."""
    lines = [f"GPU utilization by weekday and hour ({report.get('timezone') or 'local'}), "
             f"{_stamp(report['since'])} - {_stamp(report['until'])}"]
    lines.append("     " + "".join(f"{h:<2}" if h % 3 == 0 else "  " for h in range(24)))
    for name, row in zip(report["weekdays"], report["utilization"]):
        lines.append(f"{name}  " + "".join(shade(v) * 2 for v in row))
    lines.append("     " + "  ".join(f"{SHADES[i]} {i * 20}-{i * 20 + 20}%" if i else "' ' 0-20%"
                                     for i in range(len(SHADES))) + "  · no data")
    return "\n".join(lines)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))




def format_findings(findings: list[dict[str, Any]], now: float) -> str:
    """One line per finding: when, kind, open or closed, message."""
    lines = []
    for f in findings:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(f["time"]))
        state = "open" if f.get("open") else "closed"
        lines.append(f"{f['id']:>5}  {stamp}  {f['kind']:<16}  {state:<6}  {f['message']}")
    return "\n".join(lines)


__all__ = ["SHADES", "format_findings", "format_heatmap", "format_usage", "shade"]
