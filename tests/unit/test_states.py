"""The codes and statuses of app/core/states.py: their kinds and the rules between them."""

from __future__ import annotations

import hiredis
import pytest

from app.core.states import ERROR_MESSAGES, BusinessCode, ErrorCode


def codes(kind: type) -> dict[str, int]:
    return {name: value for name, value in vars(kind).items() if name.isupper()}


@pytest.mark.parametrize("kind", [ErrorCode, BusinessCode])
def test_codes_are_plain_ints_that_redis_accepts_as_arguments(kind: type) -> None:
    found = codes(kind)
    assert found and all(type(value) is int for value in found.values())
    assert len(set(found.values())) == len(found)
    for value in found.values():
        hiredis.pack_command(("HSET", "k", "error_code", value))  # an int subclass raises TypeError here


def test_service_codes_are_negative_business_codes_positive_and_every_service_code_has_a_message() -> None:
    assert all(v < 0 for v in codes(ErrorCode).values()) and all(v > 0 for v in codes(BusinessCode).values())
    assert set(ERROR_MESSAGES) == set(codes(ErrorCode).values())
