"""Shared test setup. Unit fixtures live in tests/unit/conftest.py, real-process ones in
tests/integration/conftest.py (harness in tests/integration/harness.py)."""
