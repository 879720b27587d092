"""The alert webhook: one JSON POST, run as an RQ job so a slow receiver never blocks housekeeping."""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

log = logging.getLogger(__name__)
TIMEOUT = 5  # seconds for one POST; RQ retries the job (see Housekeeper._failure_alert)


def post_alert(url: str, alert: dict[str, Any]) -> int:
    """POST ``alert`` as JSON to ``url``; raises on a network error or a non-2xx answer so RQ retries."""
    request = urllib.request.Request(
        url, data=json.dumps(alert).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "taskport-alerts"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310 - operator-configured URL
        status = int(response.status)
    log.info("alert delivered to the webhook (HTTP %d)", status)
    return status
