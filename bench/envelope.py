"""The submit envelope's cost: the fast path derived from ``SubmitSchema`` (app.web.fastload.FastLoad, what
``app.web.intake.envelope`` answers a valid body with) against marshmallow's own ``SubmitSchema().load``,
on the body ``make bench`` submits (bench.loadgen.SUBMIT_BODY). In-process, CPU only, a second or two:

    .venv/bin/python bench/envelope.py      # also a row of ``make bench`` (its part "trips")
"""

from __future__ import annotations

import sys
import time
import timeit
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from bench.loadgen import SUBMIT_BODY  # noqa: E402

NUMBER = 20_000  # calls per timing
REPEAT = 5  # timings; the best counts


def _best_us(call: Any) -> float:
    return min(timeit.repeat(call, timer=time.process_time, number=NUMBER, repeat=REPEAT)) / NUMBER * 1e6


def measure() -> dict[str, Any]:
    """µs per call of the fast path and of marshmallow's load, for the same typical body (both answer it)."""
    from app.web.intake import _fast_envelope, _submit_schema
    from app.web.intake import envelope as _envelope

    body = orjson.loads(SUBMIT_BODY % 7)
    assert _fast_envelope(body) == _submit_schema.load(body), "the fast path must answer what the schema answers"
    return {"body": body, "fast_path_us": _best_us(lambda: _envelope(body)),
            "schema_load_us": _best_us(lambda: _submit_schema.load(body))}


def main() -> None:
    found = measure()
    fast, schema = found["fast_path_us"], found["schema_load_us"]
    body = orjson.dumps(found["body"]).decode()
    print(f"submit envelope {body}, µs of CPU per call (best of {REPEAT} × {NUMBER:,}):")
    print(f"  derived fast path (_envelope)   {fast:6.2f}")
    print(f"  SubmitSchema().load             {schema:6.2f}")
    print(f"  fast path / load                {fast / schema:6.2f}x")


if __name__ == "__main__":
    main()
