"""Marshmallow schemas of the batch endpoints' inputs (and of their documents, for the OpenAPI page)."""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, fields, validate

from app.core.batches import COUNTED, DONE, MAX_TASKS, RUNNING
from app.web.schemas import (
    CallbackStateSchema,
    HistoryQuerySchema,
    ItemsSchema,
    ReadTokenSchema,
    StatusDocumentSchema,
)


class StrictBoolean(fields.Boolean):
    """true or false, and nothing else (marshmallow's Boolean takes 1 and "yes" too: the document says boolean)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if type(value) is not bool:
            raise self.make_error("invalid", input=value)
        return value


class BatchSchema(Schema):
    """The body of ``POST /batches``; each task (and ``then``) is a submit body, checked as a submit."""

    class Meta:
        unknown = RAISE

    tasks = fields.List(fields.Raw(), required=True, validate=validate.Length(min=1, max=MAX_TASKS), metadata={
        "description": f"1-{MAX_TASKS} submit bodies (as POST /tasks takes them), created together or not at all"})
    then = fields.Dict(keys=fields.String(), load_default=None, metadata={
        "description": "a submit body (no after, run_at or delay): created PENDING with the batch, queued once when "
                       "every task of the batch has ended, whatever their outcomes"})
    callback = fields.Dict(keys=fields.String(), load_default=None, metadata={
        "description": '`{"url": "https://..."}`: a signed POST of the batch document once, when it is DONE'})
    read_token = StrictBoolean(load_default=False, metadata={
        "description": "true: the 202 carries `read_token`, a token reading this batch and its tasks (docs/api.md, "
                       "Read tokens)"})


class BatchTasksQuerySchema(HistoryQuerySchema):
    """``GET /batches/{id}/tasks``: the history's status, limit and cursor (no type filter)."""

    class Meta:
        unknown = RAISE
        exclude = ("type",)


# -- documentation only (the OpenAPI document); views render these bodies directly --


class BatchLinksSchema(Schema):
    self = fields.String()
    tasks = fields.String()
    events = fields.String()
    then = fields.String(allow_none=True)


class BatchDocumentSchema(Schema):
    """The batch document."""

    batch_id = fields.UUID()
    size = fields.Integer(metadata={"description": "its tasks (`then` not counted)"})
    status = fields.String(validate=validate.OneOf([RUNNING, DONE]), metadata={
        "description": "DONE once none of its tasks is PENDING or PROCESSING"})
    counts = fields.Dict(keys=fields.String(validate=validate.OneOf(COUNTED)), values=fields.Integer(), metadata={
        "description": "how many of its tasks are in each status"})
    progress = fields.Integer(metadata={"description": "0-100: the mean of its tasks' progress (an ended one is 100)"})
    items = fields.Nested(ItemsSchema, metadata={"description": "its tasks' item counts, summed"})
    then_task_id = fields.UUID(allow_none=True)
    created_at = fields.String()
    completed_at = fields.String(allow_none=True)
    expires_at = fields.String(metadata={"description": "when the last of its tasks expires; the batch with it"})
    callback = fields.Nested(CallbackStateSchema, allow_none=True)
    links = fields.Nested(BatchLinksSchema)


class BatchEntrySchema(Schema):
    task_id = fields.UUID()
    status = fields.String()
    duplicate = fields.Boolean(metadata={"description": "an existing task held its dedup key: referenced, not "
                                                        "created again"})


class BatchAcceptedSchema(BatchDocumentSchema):
    """202 body of ``POST /batches``: the batch document and its tasks in submit order."""

    tasks = fields.List(fields.Nested(BatchEntrySchema))
    read_token = fields.Nested(ReadTokenSchema, metadata={
        "description": "only when the submit asked `read_token: true`: a token reading this batch and its tasks"})


class BatchTasksPageSchema(Schema):
    tasks = fields.List(fields.Nested(StatusDocumentSchema))
    next_cursor = fields.String(allow_none=True)
