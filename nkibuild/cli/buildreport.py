"""What a build leaves besides its outputs: its cache counts in the local cache's build
log (for `nkibuild cache stats`), and the `--report FILE` document, written at the end
of every build that started: finished, failed or interrupted."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nkibuild.cache.stats import CacheCounters, record_build
from nkibuild.errors import describe_os_error
from nkibuild.fsutil import atomic_write_text
from nkibuild.graph.report import Display, RecordingDisplay, build_report


@dataclass
class Recording:
    """The display to give the build, and whether the report could be written."""

    display: RecordingDisplay
    report: Path | None
    report_failed: bool = False


@contextlib.contextmanager
def recorded(
    command: str,
    report: Path | None,
    counters: CacheCounters,
    display: Display,
) -> Iterator[Recording]:
    """Run a build with `record.display`; afterwards (also after Ctrl-C) log its cache
    counts and write `report`. A build that did not start (a usage error) leaves neither."""
    record = Recording(RecordingDisplay(display), report)
    started = time.monotonic()
    try:
        yield record
    except KeyboardInterrupt:
        _finish(record, command, counters, started, interrupted=True)
        raise
    _finish(record, command, counters, started, interrupted=False)


def _finish(
    record: Recording,
    command: str,
    counters: CacheCounters,
    started: float,
    *,
    interrupted: bool,
) -> None:
    counts = counters.snapshot()
    # A read-only cache is written nothing, not even its log (`log_dir` is None); a build
    # that looked nothing up (all up to date) would only push records out of the log.
    if counters.log_dir is not None and counts:
        for notice in record_build(counters.log_dir, counts):
            print(f"warning: {notice}", file=sys.stderr)
    if record.report is None:
        return
    document = build_report(
        record.display.summary,
        counts,
        command=command,
        interrupted=interrupted,
        seconds=time.monotonic() - started,
    )
    try:
        record.report.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record.report, json.dumps(document, indent=2))
    except OSError as error:
        record.report_failed = True
        print(
            f"error: the build report {record.report} was not written: {describe_os_error(error)}",
            file=sys.stderr,
        )
