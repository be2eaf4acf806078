"""The help desk's own tools, for the demo agent (registered always): its knowledge base
and its orders (`agents/demo.py`). `http_get` (tools/http.py) and `send_email`
(tools/mail.py) are the production tools it also offers.

| tool | risk | returns | retry safety | why |
|---|---|---|---|---|
| kb_search | read | internal | safe | our own knowledge base |
| refund | irreversible | internal | unsafe | money leaves; a repeat would pay twice |
| export_customers | read | internal | safe | our own customer list (what the demo's "writes after reading a customer export" rule watches for) |
"""

from __future__ import annotations

from typing import Any

from agents import demo
from agents.engine.registry import ToolContext, ToolSpec
from agents.models import LedgerEntry


class UnknownOrder(Exception):
    pass


# -- kb_search -----------------------------------------------------------------------


def kb_search(args: dict[str, Any], ctx: ToolContext) -> list[dict[str, str]]:
    return demo.kb_search(args["query"])


# -- refund --------------------------------------------------------------------------


def refund(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    order_id = args["order_id"].lstrip("#")
    order = demo.ORDERS.get(order_id)
    if order is None:
        raise UnknownOrder(f"no order {order_id!r} (known: {', '.join(sorted(demo.ORDERS))})")
    # `customer` is what the demo's "over 500 EUR to one customer" rule sums by: it must
    # be the order's, or a refund could be counted against someone else.
    if "customer" in args and args["customer"] != order["customer"]:
        raise ValueError(f"order {order_id} is not {args['customer']}'s")
    total = int(order["amount_cents"])  # type: ignore[call-overload]
    # `amount` is what argument rules read (the demo profile allows refunds under 20
    # without asking); without it the refund is the order's full amount.
    cents = round(args["amount"] * 100) if "amount" in args else total
    if cents > total:
        raise ValueError(f"amount {cents / 100:.2f} is more than order {order_id} cost ({total / 100:.2f})")
    # No idempotency key on the row: like a payment API without one, every run pays.
    LedgerEntry.objects.create(
        run_id=int(ctx.run_id), idempotency_key=None,
        entry={"kind": "refund", "order_id": order_id, "amount_cents": cents, "reason": args["reason"]},
    )
    return {"refunded": True, "order_id": order_id, "item": order["item"], "amount_cents": cents}


# -- export_customers -----------------------------------------------------------------


def export_customers(args: dict[str, Any], ctx: ToolContext) -> list[dict[str, str]]:
    return [dict(c) for c in demo.CUSTOMERS]


TOOLS = [
    ToolSpec(
        "kb_search", "Searches the help desk's knowledge base; returns up to 3 articles.",
        {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 500}},
         "required": ["query"], "additionalProperties": False},
        "read", "internal", "safe", kb_search, timeout=5,
    ),
    ToolSpec(
        "refund", "Refunds an order in full to the customer's original payment method. Cannot be undone.",
        {"type": "object",
         "properties": {"order_id": {"type": "string", "pattern": "^#?[0-9]{1,12}$"},
                        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000,
                                   "description": "EUR to refund; the order's full amount when left out"},
                        "customer": {"type": "string", "maxLength": 254,
                                     "description": "the order's customer (email), as the order has it"},
                        "reason": {"type": "string", "minLength": 1, "maxLength": 500}},
         "required": ["order_id", "reason"], "additionalProperties": False},
        "irreversible", "internal", "unsafe", refund, timeout=30,
    ),
    ToolSpec(
        "export_customers", "Exports the help desk's customer list: names and email addresses.",
        {"type": "object", "properties": {}, "additionalProperties": False},
        "read", "internal", "safe", export_customers, timeout=5,
    ),
]
