"""What the Slurm runner (`slurm.py`) reads in Slurm's own words and lists: pending reason codes
as words a person reads (`PENDING_REASONS`, `pending_reason`), node lists ('n[1-3,7]':
`expand_nodes`), GPU indices from squeue's gres detail (`_gpu_indices`, per node:
`_per_node`), a node's GPUs from its gres (`_node_gpus`), and array task strings
(`_in_task_string`). Pure functions of the text, no Slurm call.

May call: nothing of the package.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: Slurm's pending reasons in words a person reads (the rest are shown as Slurm names them).
PENDING_REASONS = {
    "None": "waiting for Slurm to schedule it",
    "Resources": "waiting for resources (the GPUs it needs are in use)",
    "Priority": "waiting for higher-priority jobs",
    "Dependency": "held by dependency",
    "DependencyNeverSatisfied": "its dependency can never be satisfied",
    "BeginTime": "waiting for its begin time",
    "JobArrayTaskLimit": "array limit reached (at most %N of its tasks run at once)",
    "JobHeldUser": "held by its owner",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "the nodes it needs are not available (down, drained or reserved)",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "PartitionNodeLimit": "asks for more nodes than its partition allows",
    "PartitionTimeLimit": "its time limit is over the partition's limit",
    "Reservation": "waiting for its reservation",
    "Licenses": "waiting for licenses",
    "BadConstraints": "its constraints cannot be met",
    "Cleaning": "its node is cleaning up after a previous job",
    "launch failed requeued held": "its launch failed; requeued and held",
}


def pending_reason(code: str) -> str:
    """Slurm's reason code as words: 'QOSMaxGRESPerUser' -> 'over the QOS GPU limit (QOSMaxGRESPerUser)'."""
    code = code or "None"
    if code in PENDING_REASONS:
        return PENDING_REASONS[code]
    for prefix, whose in (("QOS", "the QOS"), ("Assoc", "the account's")):
        if code.startswith(prefix):
            what = "GPU " if "GRES" in code or "TRES" in code else ("job " if "Job" in code else "")
            return f"over {whose} {what}limit ({code})"
    return f"held by Slurm: {code}"


def _in_task_string(index: int, text: str) -> bool:
    """Is array task `index` in Slurm's task string ('2-3%2', '1,4,7-9')?"""
    for part in text.split("%")[0].split(","):
        part = part.split(":")[0]
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit() and int(a) <= index <= int(b):
                return True
        elif part.isdigit() and int(part) == index:
            return True
    return False


def _per_node(rec: dict[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A multi-node job's GPU indices per node, from squeue's `nodes` and `gres_detail` (one
    entry per node, in the node list's order); () for a job on one node."""
    names = expand_nodes(str(rec.get("nodes") or ""))
    detail = rec.get("gres_detail") or []
    if len(names) < 2 or len(detail) != len(names):
        return ()
    return tuple((n, _gpu_indices([d])) for n, d in zip(names, detail))


def expand_nodes(text: str) -> list[str]:
    """Slurm's node list in full: 'n[1-3,7],gpu5' -> ['n1', 'n2', 'n3', 'n7', 'gpu5'] (one
    bracket per name, as Slurm writes them; zero padding kept: 'n[08-10]' -> n08, n09, n10)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?", text):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            a, _, b = part.partition("-")
            if not b:
                out.append(prefix + a)
            elif a.isdigit() and b.isdigit():
                out.extend(f"{prefix}{i:0{len(a)}d}" for i in range(int(a), int(b) + 1))
    return out


def _gpu_indices(gres_detail: Sequence[str]) -> tuple[int, ...]:
    """['gpu:a100:2(IDX:0-1)', 'gpu:1(IDX:3)'] -> (0, 1, 3)."""
    out: list[int] = []
    for item in gres_detail:
        if not item.startswith("gpu") or "IDX:" not in item:
            continue
        spec = item.split("IDX:", 1)[1].rstrip(")")
        for part in spec.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            elif part.isdigit():
                out.append(int(part))
    return tuple(out)


def _node_gpus(gres: str) -> list[tuple[str, int]]:
    """'gpu:a100:4,gpu:t4:2(S:0)' -> [('a100', 4), ('t4', 2)]."""
    out = []
    for item in (gres or "").split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        kind = parts[1] if len(parts) == 3 else "gpu"
        if count.isdigit():
            out.append((kind, int(count)))
    return out
