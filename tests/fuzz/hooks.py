"""schemathesis hooks for ``make test-fuzz`` (loaded through SCHEMATHESIS_HOOKS by tests/fuzz/test_contract.py).

One failure is not the API's: use_after_free (ST301) takes every successful DELETE for a removal and fails any 2xx
read below its path anywhere in the same scenario tree (schemathesis 4.32.5, specs/openapi/checks.py: the check
walks the whole tree from its root). DELETE /api/v1/tasks/{id} and DELETE /api/v1/batches/{id} are cancels: by
contract (docs/api.md) the task or batch stays readable, CANCELLED, and a cancelled task may run again. The run
names ``--checks all``, which overrides any per-operation setting of the config file, so the exception lives here,
as narrow as it can be: an ST301 whose DELETE was one of those two cancels. DELETE /api/v1/schedules/{id} is a
true delete and stays judged, and so is every other check everywhere. schemathesis reports the dropped count.
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis

# the DELETEs that cancel (operationIds cancelTask, cancelBatch), as UseAfterFree.free renders them
CANCEL = re.compile(r"DELETE /api/v1/(tasks|batches)/[^/?]+")


def is_cancel_read(failure: Any) -> bool:
    """Whether ``failure`` is use_after_free's finding of a read after a cancel (nothing else)."""
    return getattr(failure, "code", "") == "ST301" and bool(CANCEL.fullmatch(getattr(failure, "free", "")))


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    return not is_cancel_read(failure)
