"""Marshmallow schemas of the schedule endpoints (/api/v1/schedules): inputs, and documents for OpenAPI.

A schedule's ``task`` is a submit body (app.web.schemas.SubmitSchema) without what makes no sense per fire
time: its fields are SubmitSchema's own (copied from it, so the two cannot drift), minus the dedup key (a
fired task's dedup key is derived from the schedule and the fire time) and the timing fields.
"""

from __future__ import annotations

import copy

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from app.core import cron
from app.core.fields import JsonBoolean
from app.core.history import CURSOR_PATTERN
from app.web.schemas import SubmitSchema

MAX_NAME = 100





class ScheduleTaskSchema(Schema):
    """What each fire time submits: ``type``, ``payload`` (checked against the type's schema), ``priority`` and
    ``callback`` (checked as a submit's)."""

    class Meta:
        unknown = RAISE

    type = copy.deepcopy(SubmitSchema._declared_fields["type"])
    payload = copy.deepcopy(SubmitSchema._declared_fields["payload"])
    priority = copy.deepcopy(SubmitSchema._declared_fields["priority"])
    callback = copy.deepcopy(SubmitSchema._declared_fields["callback"])


def _check_cron(value: str) -> None:
    try:
        cron.check(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def _check_zone(value: str) -> None:
    try:
        cron.zone(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class ScheduleCreateSchema(Schema):
    class Meta:
        unknown = RAISE

    cron = fields.String(required=True, validate=[validate.Length(min=1, max=cron.MAX_CRON), _check_cron],
                         metadata={"description": "5 fields: minute hour day-of-month month day-of-week",
                                   "example": "*/15 * * * *"})
    timezone = fields.String(load_default="UTC", validate=_check_zone,
                             metadata={"description": "IANA name; fire times are read in it", "example": "UTC"})
    task = fields.Nested(ScheduleTaskSchema, required=True)
    name = fields.String(load_default="", validate=validate.Length(max=MAX_NAME))
    paused = JsonBoolean(load_default=False)


class ScheduleUpdateSchema(Schema):
    class Meta:
        unknown = RAISE

    cron = fields.String(validate=[validate.Length(min=1, max=cron.MAX_CRON), _check_cron])
    timezone = fields.String(validate=_check_zone)
    task = fields.Nested(ScheduleTaskSchema)
    paused = JsonBoolean()


class ScheduleQuerySchema(Schema):
    class Meta:
        unknown = RAISE

    limit = fields.Integer(validate=validate.Range(min=1, max=200), load_default=50)
    cursor = fields.String(validate=validate.Regexp(CURSOR_PATTERN), load_default=None,
                           metadata={"description": "opaque: the next_cursor of a previous page, unchanged"})


# -- documentation only (app.web.api.schedule_docs); the views render these bodies directly --


class ScheduleLinksSchema(Schema):
    self = fields.String()
    last_task = fields.String(allow_none=True)


class ScheduleSchema(Schema):
    """The schedule document."""

    schedule_id = fields.UUID()
    name = fields.String()
    cron = fields.String()
    timezone = fields.String()
    task = fields.Nested(ScheduleTaskSchema)
    paused = fields.Boolean()
    next_run_at = fields.String(allow_none=True, metadata={"description": "the next fire time (UTC); null while "
                                                                          "paused"})
    last_run_at = fields.String(allow_none=True, metadata={"description": "when it last created a task"})
    last_task_id = fields.UUID(allow_none=True)
    created_at = fields.String()
    links = fields.Nested(ScheduleLinksSchema)


class SchedulePageSchema(Schema):
    schedules = fields.List(fields.Nested(ScheduleSchema))
    next_cursor = fields.String(allow_none=True)
