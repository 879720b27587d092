"""The ``callback`` of a submit body (a task, a batch, a schedule's task): its schema, and the checks a schema
cannot make, since they depend on the configuration and on DNS (:func:`check_callback`).

The submit, batch and schedule schemas nest :class:`CallbackSchema` and call :func:`check_callback` on what it
loaded; its errors are keyed ``url`` / ``events``, which the caller prefixes with where the callback stands
(``callback.url``, ``tasks.3.callback.url``).
"""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, fields, post_load, validate

from app.core.callback_http import MAX_URL, refusal
from app.core.callbacks import EVENTS
from app.core.config import Config


class CallbackSchema(Schema):
    """``{"url": "https://...", "events": [...]}``: where to POST the signed status document, and on which of the
    task's statuses (all four by default; a batch's callback fires once, when it is done)."""

    class Meta:
        unknown = RAISE

    url = fields.String(required=True, validate=validate.Length(min=1, max=MAX_URL), metadata={
        "description": "https URL that gets a signed POST (Standard Webhooks) of the status document",
        "example": "https://example.com/hooks/taskport"})
    events = fields.List(fields.String(validate=validate.OneOf(EVENTS)), validate=validate.Length(min=1),
                         load_default=lambda: list(EVENTS), metadata={
                             "description": "the statuses that are delivered (default: all four)"})

    @post_load
    def _once_each(self, data: dict[str, Any], **_: Any) -> dict[str, Any]:
        data["events"] = list(dict.fromkeys(data["events"]))  # a status named twice is delivered once
        return data


def check_callback(loaded: dict[str, Any], member: str, config: Config) -> dict[str, list[str]]:
    """What makes a loaded callback unacceptable for ``member``: errors keyed ``url`` / ``events`` (empty when it
    is fine). The URL policy resolves the host (app.core.callback_http), and the member needs a signing secret."""
    if member not in config.callback_keys:
        return {"url": ["Callbacks are not enabled for you: the operator must configure your signing secret in "
                        "TASKPORT_CALLBACK_SECRETS."]}
    reason = refusal(loaded["url"], config)
    return {"url": [reason]} if reason else {}
