"""The bare-RQ baseline's job: a function that does nothing (what ``demo.sleep`` with seconds=0 is to taskport)."""


def noop() -> None:
    """Return at once."""
