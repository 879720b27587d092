"""Entry point of ``make bench``: ``python bench/run.py [--quick] [--keep] ...`` (see bench/README.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from bench.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
