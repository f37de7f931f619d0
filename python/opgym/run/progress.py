"""The progress display of `opgym run`: rich on a terminal, timestamped lines otherwise."""
from __future__ import annotations

import sys
import time


class Progress:
    """A rich progress display on a terminal; plain timestamped lines otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self._rich = None
        if enabled and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RP, SpinnerColumn, TextColumn, \
                TimeElapsedColumn

            self._rich = RP(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console, transient=True)
            self._task = self._rich.add_task("starting", total=total)
            self._rich.start()

    def step(self, text: str) -> None:
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, description=text)
        else:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {text}", file=sys.stderr, flush=True)

    def done(self, n: int = 1) -> None:
        if self._rich is not None:
            self._rich.advance(self._task, n)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
