"""``orders.split``: split an order's items into shipments, one warehouse per shipment.

A suspended account fails the whole task with 10001. Each item is handled on its own: a quantity
below 1 fails it with 10002, an unpaid bill with 10001; the others are shipped. The result groups
the shipped items by warehouse, warehouses in the order they first appear among shipped items.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from app.core.processors import INT64, processor
from app.core.states import BusinessCode
from workers.context import TaskContext
from workers.exceptions import ItemError, TaskError

MAX_ITEMS = 10000
MAX_CODE = 100  # characters of order_code, item_code and warehouse: a 900 KB order_code was accepted once
DEFAULT_WAREHOUSE = "main"


class JsonBoolean(fields.Boolean):
    """true or false only: ``fields.Boolean(truthy={True}, falsy={False})`` took 0 and 1 too (0 == False)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class OrderItemSchema(Schema):
    item_code = fields.String(required=True, validate=validate.Length(min=1, max=MAX_CODE))
    quantity = fields.Integer(required=True, strict=True, validate=INT64)
    warehouse = fields.String(load_default=DEFAULT_WAREHOUSE, validate=validate.Length(max=MAX_CODE))
    bill_unpaid = JsonBoolean(load_default=False)


class SplitSchema(Schema):
    order_code = fields.String(required=True, validate=validate.Length(min=1, max=MAX_CODE))
    account_status = fields.String(load_default="active", validate=validate.OneOf(["active", "suspended"]))
    items = fields.List(
        fields.Nested(OrderItemSchema), required=True, validate=validate.Length(min=1, max=MAX_ITEMS)
    )


@processor("orders.split", schema=SplitSchema, timeout=600)
def split(payload: dict, ctx: TaskContext) -> dict:
    """Ship every valid item of the order; record the others as item failures."""
    if payload["account_status"] == "suspended":
        raise TaskError(BusinessCode.BILL_UNPAID, "bill unpaid: settle the account first")
    shipped = ctx.each(payload["items"], _ship, key=lambda item: item["item_code"])
    shipments: dict[str, list[dict]] = {}
    for item in shipped:
        line = {"item_code": item["item_code"], "quantity": item["quantity"]}
        shipments.setdefault(item["warehouse"], []).append(line)
    return {
        "order_code": payload["order_code"],
        "shipments": [{"warehouse": name, "items": lines} for name, lines in shipments.items()],
    }


def _ship(item: dict) -> dict:
    """Check one item; return it when it can ship, raise ItemError when it cannot."""
    if item["quantity"] <= 0:
        raise ItemError(
            BusinessCode.INVALID_QUANTITY, f"invalid quantity {item['quantity']}: must be at least 1"
        )
    if item["bill_unpaid"]:
        raise ItemError(BusinessCode.BILL_UNPAID, "bill unpaid: settle the bill for this item first")
    return item
