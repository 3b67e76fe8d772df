"""Writes docs/benchmarks.md from benchmark records (record.py): each table there comes with the
date, machine, versions and command of the run that produced it, and with its chart.

    python benchmarks/publish.py benchmarks/results/optimizer_step.json ...
        copies the records (and their charts, <name>.png beside them) into docs/benchmarks/,
        then writes docs/benchmarks.md from every record there
    python benchmarks/publish.py
        writes docs/benchmarks.md from docs/benchmarks/ again
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "benchmarks"
PAGE = ROOT / "docs" / "benchmarks.md"
# the order of the sections; records of other benchmarks follow
ORDER = ["optimizer_step", "train_step", "compile_time", "batch_norm", "multi_device"]

HEADER = """# Benchmarks

Every table below is a benchmark's own output, written by `python benchmarks/publish.py` from
the run's record (`docs/benchmarks/<name>.json`, with the raw numbers): run the command shown
to measure again. Timings on shared machines are noisy: the benchmarks time jgsess and its
baselines interleaved in one process and report ratios measured side by side, with the
ceiling of the work (the same memory traffic, in place) where there is one.
"""


def description(name: str) -> tuple[str, str]:
    """From the benchmark module's docstring, whose first paragraph reads "<title>: <what it
    compares>": (the title, the rest of the docstring: what it compares, how, and what its
    columns mean). Indented paragraphs (lists laid out in the docstring) stay as they are;
    usage lines are left out (the section shows the run's own command)."""
    source = (ROOT / "benchmarks" / f"{name}.py").read_text()
    doc = ast.get_docstring(ast.parse(source)) or name
    raw = [p for p in doc.split("\n\n") if not p.strip().startswith("python benchmarks/")]
    title, _, lead = " ".join(raw[0].split()).partition(": ")
    parts = [lead[:1].upper() + lead[1:]] if lead else []
    for paragraph in raw[1:]:
        if paragraph.startswith("  "):
            parts.append("```\n" + paragraph.strip("\n") + "\n```")
        else:
            parts.append(" ".join(paragraph.split()))
    return title, "\n\n".join(parts)


def section(record: dict) -> str:
    name = record["benchmark"]
    title, text = description(name)
    m, v = record["machine"], record["versions"]
    lines = [f"## {title}", "", text, ""]
    lines.append(
        f"Run {record['date']} on {m['cpu']} ({m['cpus']} CPUs, {m['memory_gib']} GiB; "
        f"{m['devices']}), jax {v['jax']}, jgsess {v['jgsess']}:"
    )
    lines += ["", f"    {record['command']}", ""]
    if record.get("notes"):
        lines += [record["notes"], ""]
    table = record["table"].rstrip()
    # a markdown table as it is; the plain-text tables some benchmarks print, as code
    lines += [table if table.startswith("|") else f"```\n{table}\n```", ""]
    if (RECORDS / f"{name}.png").exists():
        lines += [f"![{title}](benchmarks/{name}.png)", ""]
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    RECORDS.mkdir(parents=True, exist_ok=True)
    for path in map(Path, paths):
        shutil.copy2(path, RECORDS / path.name)
        chart = path.with_suffix(".png")
        if chart.exists():
            shutil.copy2(chart, RECORDS / chart.name)
    records = {p.stem: json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))}
    names = [n for n in ORDER if n in records] + sorted(set(records) - set(ORDER))
    PAGE.write_text("\n".join([HEADER, *(section(records[n]) for n in names)]))
    print(f"wrote {PAGE.relative_to(ROOT)} from {len(names)} record(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
