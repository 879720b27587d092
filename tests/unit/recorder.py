"""A stand-in for the runner's ``report()``, which a TaskContext calls on every progress write."""

from __future__ import annotations

from typing import Any


class Recorder:
    """Records every write and answers a settable ``status`` (``error``: raised instead of answering)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, str, dict | None]] = []
        self.saved: list[Any] = []  # the checkpoint (workers.checkpoint.Saved) of each write, None for none
        self.status = "PROCESSING"
        self.error: Exception | None = None

    def __call__(self, progress: int | None, message: str, items: dict | None, saved: Any = None) -> str:
        if self.error is not None:
            raise self.error
        self.calls.append((progress, message, items))
        self.saved.append(saved)
        return self.status

    @property
    def last(self) -> tuple[int | None, str, dict | None]:
        return self.calls[-1]

    @property
    def messages(self) -> list[str]:
        return [call[1] for call in self.calls]
