"""release-report.json and release-report.md: what each project and unit got, and totals."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.fsutil import atomic_write_text
from nkibuild.graph.report import compile_counts

if TYPE_CHECKING:
    from nkibuild.context import BuildContext
    from nkibuild.release import ReleaseResult


def write_reports(result: ReleaseResult, out: Path) -> None:
    report = build_report(result)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "release-report.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out / "release-report.md", render_markdown(report))


def build_report(result: ReleaseResult) -> dict[str, Any]:
    statuses = {o.name: o for o in result.summary.outcomes}
    projects = [_project(p, statuses) for p in result.projects]
    units = [u for p in projects for u in p["units"]]
    counts = compile_counts(Counter(u["origin"] for u in units))  # as the build summary's
    failures = [
        {"task": o.name, "detail": o.detail}
        for o in result.summary.outcomes
        if o.status == "failed"
    ]
    return {
        "ok": result.ok,
        "projects": projects,
        "totals": {
            "projects": len(projects),
            "units": len(units),
            **counts,
            "cache_hits": counts["local_cache_hits"] + counts["remote_cache_hits"],
            "up_to_date": sum(u["status"] == "up-to-date" for u in units),
            "compile_seconds": round(sum(u["compile_seconds"] or 0 for u in units), 3),
            "neff_bytes": sum(u["neff_bytes"] or 0 for u in units),
        },
        "published": [p.name for p in result.published],
        "provenance": [p.name for p in result.provenance],
        "refused": result.refused,
        "failures": failures,
        "notices": result.summary.notices,
    }


def _project(project: BuildContext, statuses: dict[str, Any]) -> dict[str, Any]:
    name = project.manifest.package.name
    return {
        "name": name,
        "version": project.manifest.package.version,
        "manifest": str(project.manifest.path),
        "units": [
            _unit(project, unit, statuses.get(f"{name}/compile:{unit.name}"))
            for unit in project.units
        ],
    }


def _unit(project: BuildContext, unit: Any, outcome: Any) -> dict[str, Any]:
    from nkibuild.compiler.record import last_result

    status = outcome.status if outcome is not None else "not run"
    result = last_result(project.layout.compile_dir(unit))
    return {
        "unit": unit.name,
        "kernel": unit.kernel,
        "variant": unit.variant,
        "target": unit.target,
        "status": status,
        "origin": (outcome.detail if status == "done" else "") or (result.origin if result else ""),
        "compile_seconds": result.compile_seconds if result else None,
        "neff_bytes": result.neff_path.stat().st_size if result else None,
        "compiler_version": result.compiler_version if result else None,
    }


def render_markdown(report: dict[str, Any]) -> str:
    totals = report["totals"]
    lines = [
        "# Release report",
        "",
        f"**{'OK' if report['ok'] else 'FAILED'}**: {totals['projects']} projects, "
        f"{totals['units']} units; {totals['compiled']} compiled, "
        f"{totals['reused_from_build_dir']} reused from build dir, "
        f"{totals['local_cache_hits']} local cache hits, "
        f"{totals['remote_cache_hits']} remote cache hits, "
        f"{totals['up_to_date']} up to date; {totals['compile_seconds']:.1f} s "
        f"of compiling; {totals['neff_bytes']} bytes of NEFFs.",
        "",
        "| project | unit | status | origin | compile s | NEFF bytes | compiler |",
        "|---|---|---|---|---|---|---|",
    ]
    for project in report["projects"]:
        for unit in project["units"]:
            seconds = unit["compile_seconds"]
            lines.append(
                f"| {project['name']} {project['version']} | {unit['unit']} | {unit['status']} "
                f"| {unit['origin']} | {'' if seconds is None else seconds} "
                f"| {unit['neff_bytes'] or ''} | {unit['compiler_version'] or ''} |"
            )
    for section in ("published", "provenance", "refused"):
        if report[section]:
            lines += ["", f"## {section.capitalize()}", "", *(f"- {x}" for x in report[section])]
    for failure in report["failures"]:
        lines += ["", f"## Failed: {failure['task']}", "", "```", failure["detail"], "```"]
    return "\n".join(lines) + "\n"
