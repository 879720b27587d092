"""Marshmallow schemas of the HTTP contract's inputs (and of its documents, for the OpenAPI page)."""

from __future__ import annotations

from marshmallow import RAISE, Schema, fields, validate

from app.states import QUEUES, STORED

MAX_DEDUP_KEY = 128


class SubmitSchema(Schema):
    class Meta:
        unknown = RAISE

    type = fields.String(required=True, validate=validate.Length(min=1, max=200))
    payload = fields.Dict(keys=fields.String(), load_default=dict)
    dedup_key = fields.String(validate=validate.Length(min=1, max=MAX_DEDUP_KEY), load_default=None)
    priority = fields.String(validate=validate.OneOf(QUEUES), load_default=None)


class HistoryQuerySchema(Schema):
    class Meta:
        unknown = RAISE

    status = fields.String(validate=validate.OneOf(sorted(STORED)), load_default=None)
    type = fields.String(validate=validate.Length(min=1, max=200), load_default=None)
    limit = fields.Integer(validate=validate.Range(min=1, max=200), load_default=50)
    cursor = fields.String(validate=validate.Length(min=1, max=200), load_default=None)


class ItemsSchema(Schema):
    total = fields.Integer()
    succeeded = fields.Integer()
    failed = fields.Integer()


class ErrorSchema(Schema):
    code = fields.Integer()
    message = fields.String()


class LinksSchema(Schema):
    self = fields.String()
    result = fields.String()
    events = fields.String()


class StatusDocumentSchema(Schema):
    """The task status document (documentation only: the hot path renders it without a schema)."""

    task_id = fields.UUID()
    type = fields.String()
    status = fields.String(validate=validate.OneOf([*sorted(STORED), "DUPLICATE"]))
    progress = fields.Integer()
    message = fields.String(allow_none=True)
    items = fields.Nested(ItemsSchema, allow_none=True)
    error = fields.Nested(ErrorSchema, allow_none=True)
    attempts = fields.Integer()
    created_at = fields.String()
    started_at = fields.String(allow_none=True)
    updated_at = fields.String()
    completed_at = fields.String(allow_none=True)
    expires_at = fields.String()
    links = fields.Nested(LinksSchema)
