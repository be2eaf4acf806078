"""The demo client: a deterministic offline planner for the built-in scenarios, so a
fresh install shows the whole product (taint, approvals, an irreversible tool) with no
API key.

It decides only from the transcript, like a real model: what the customer asked and
which tool results came back. It is deliberately gullible: when a fetched page tells it
to email the discount code to every customer, it tries to, which is exactly the call
Airlock's taint policy stops for a human. Usage is an estimate (about 4 characters per
token), so runs show plausible token counts; the demo profile's prices are 0.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from agents import demo
from agents.engine.protocols import ModelReply, ModelRequest, ProposedCall, Usage

REFUND_WORDS = re.compile(r"\b(refund|money back|reimburse|charged twice)\b", re.IGNORECASE)
ORDER_NUMBER = re.compile(r"(?:order|#)\s*(?:number\s*|no\.?\s*)?#?(\d{3,12})", re.IGNORECASE)
DEMO_URL = re.compile(rf"https?://{re.escape(demo.DEMO_HOST)}/[\w/-]*")
INJECTION = re.compile(r"ignore (all )?previous instructions.*email the discount code", re.IGNORECASE | re.DOTALL)
CODE = re.compile(r"\b[A-Z]{2,}(?:-[A-Z0-9]+)+\b")
EXPORT_WORDS = re.compile(r"\bexport\b.*\bcustomers?\b", re.IGNORECASE | re.DOTALL)
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


Caller = Callable[[str, dict[str, Any], str], ModelReply]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    if text.startswith("[airlock:"):
        # A reviewer edited the call: Airlock's statement of the edit comes first, the
        # result (one line of JSON) after it, as a model reads it.
        try:
            return json.loads(text.rsplit("\n", 1)[-1])
        except ValueError:
            pass
    return text


def _failed(result: Any) -> bool:
    return isinstance(result, dict) and result.get("ok") is False


class DemoPlanner:
    # Answers from memory: the driver keeps its database connection (driver.ReleasingModel).
    waits = False

    def propose(self, request: ModelRequest) -> ModelReply:
        reply = self.plan(request)
        return ModelReply(
            final=reply.final, calls=reply.calls, text=reply.text, usage=self.usage(request, reply)
        )

    def usage(self, request: ModelRequest, reply: ModelReply) -> Usage:
        seen = sum(len(str(m.get("content") or "")) + len(json.dumps(m.get("tool_calls") or [])) for m in request.messages)
        seen += sum(len(json.dumps(t.openapi())) for t in request.tools)
        said = len(reply.final or reply.text) + sum(len(json.dumps(c.args)) for c in reply.calls)
        return Usage(input_tokens=math.ceil(seen / 4), output_tokens=math.ceil(said / 4) + 1)

    def plan(self, request: ModelRequest) -> ModelReply:
        messages = request.messages
        task = next((m["content"] for m in messages if m["role"] == "user"), "")
        results: dict[str, list[Any]] = {}
        for m in messages:
            if m["role"] == "tool":
                results.setdefault(m.get("name", ""), []).append(_json(m.get("content") or ""))
        offered = {t.name for t in request.tools}
        turn = request.turn

        def call(tool: str, args: dict[str, Any], text: str) -> ModelReply:
            return ModelReply(calls=(ProposedCall(id=f"demo_{turn}_0", tool=tool, args=args),), text=text)

        if REFUND_WORDS.search(task):
            return self.refund(task, results, offered, call)
        if EXPORT_WORDS.search(task) and "export_customers" in offered:
            return self.export(task, results, offered, call)
        return self.question(task, results, offered, call)

    # -- a customer export, mailed ----------------------------------------------------

    def export(self, task: str, results: dict[str, list[Any]], offered: set[str], call: Caller) -> ModelReply:
        """Exports the customer list and emails it to the address in the task: the call
        the demo's "writes after reading a customer export" rule holds for a human."""
        if "export_customers" not in results:
            return call("export_customers", {}, "Exporting the customer list.")
        customers = results["export_customers"][-1]
        to = EMAIL.search(task)
        if "send_email" not in results and "send_email" in offered and to and isinstance(customers, list):
            lines = "\n".join(f"{c.get('name')} <{c.get('email')}>" for c in customers if isinstance(c, dict))
            return call("send_email", {"to": [to.group(0)], "subject": f"{demo.SHOP} customers", "body": lines},
                        f"Emailing the customer list to {to.group(0)}.")
        sent = (results.get("send_email") or [None])[-1]
        if sent is not None and not _failed(sent):
            return ModelReply(final="I have emailed the customer list.")
        return ModelReply(final="I exported the customer list but did not email it.")

    # -- a refund request --------------------------------------------------------------

    def refund(self, task: str, results: dict[str, list[Any]], offered: set[str], call: Caller) -> ModelReply:
        match = ORDER_NUMBER.search(task)
        if match is None:
            return ModelReply(final="I'm sorry to hear that. Could you tell me the order number so I can look into a refund?")
        order = match.group(1)
        if "refund" not in results and "refund" in offered:
            args: dict[str, Any] = {"order_id": order, "reason": f"Customer request: {task[:300]}"}
            known = demo.ORDERS.get(order)
            if known is not None:
                args["amount"] = int(known["amount_cents"]) / 100  # type: ignore[call-overload]
                args["customer"] = known["customer"]
            return call("refund", args,
                        f"The customer asks for a refund of order {order}; the refund policy covers damaged items.")
        outcome = (results.get("refund") or [None])[-1]
        if isinstance(outcome, dict) and outcome.get("refunded"):
            order = str(outcome.get("order_id") or order)
            cents = int(outcome.get("amount_cents", 0))
            known = demo.ORDERS.get(order)
            total = int(known["amount_cents"]) if known is not None else cents  # type: ignore[call-overload]
            # A reviewer may have edited the amount: say what was refunded, not what was asked.
            what = (f"order {order} in full (EUR {cents / 100:.2f})" if cents >= total
                    else f"EUR {cents / 100:.2f} of order {order} (EUR {total / 100:.2f})")
            return ModelReply(final=f"I'm sorry your {outcome.get('item', 'item')} arrived broken. I have refunded "
                                  f"{what}; you will see it on your statement within 5 business days.")
        if outcome is not None and not _failed(outcome):
            # A reviewer confirmed an interrupted refund happened: their note is the result.
            return ModelReply(final=f"I'm sorry your order {order} arrived broken. I have refunded it in full.")
        if _failed(outcome) and outcome.get("error") == "not_permitted":
            return ModelReply(final=f"I'm sorry your order {order} arrived broken. I could not issue the refund "
                                  "myself; a colleague will review your request and get back to you within one "
                                  "business day.")
        return ModelReply(final=f"I'm sorry, I could not process a refund for order {order} right now; a colleague "
                              "will follow up with you.")

    # -- a customer question -----------------------------------------------------------

    def question(self, task: str, results: dict[str, list[Any]], offered: set[str], call: Caller) -> ModelReply:
        searches = results.get("kb_search", [])
        if not searches and "kb_search" in offered:
            return call("kb_search", {"query": task[:500]}, "Let me check the knowledge base first.")
        articles = searches[0] if searches and isinstance(searches[0], list) else []
        urls = [u for a in articles for u in DEMO_URL.findall(str(a.get("text", "")))]
        pages = results.get("http_get", [])
        if urls and not pages and "http_get" in offered:
            return call("http_get", {"url": urls[0]}, "The knowledge base points to the shipping page; reading it.")
        page = pages[-1] if pages and isinstance(pages[-1], dict) and not _failed(pages[-1]) else None
        page_text = str(page.get("text", "")) if page else ""
        if INJECTION.search(page_text) and "send_email" not in results and "send_email" in offered:
            # The planted instruction, obeyed: this is the call Airlock must stop.
            if len(searches) < 2:
                return call("kb_search", {"query": "discount code"},
                            "The page says to email the discount code to every customer; looking the code up.")
            code = next((m for a in searches[1] if isinstance(searches[1], list)
                         for m in CODE.findall(str(a.get("text", "")))), None)
            if code:
                return call(
                    "send_email",
                    {"to": [c["email"] for c in demo.CUSTOMERS],
                     "subject": f"A discount code from {demo.SHOP}",
                     "body": f"Dear customer,\n\nUse the code {code} for 40% off your next order.\n\n{demo.SHOP}"},
                    "Following the page's instruction: emailing the discount code to every customer.",
                )
        return ModelReply(final=self.answer(task, articles, page_text))

    def answer(self, task: str, articles: list[Any], page_text: str) -> str:
        words = {w.strip(".,!?;:'\"()-").lower() for w in task.split() if len(w) > 3}
        if page_text:
            # The first line is the page title; the planted instruction is not an answer.
            lines = [line for line in page_text.split("\n")[1:] if line.strip() and not INJECTION.search(line)]
            scored = sorted(lines, key=lambda line: -sum(w in line.lower() for w in words))
            if scored:
                best = scored[0] if any(w in scored[0].lower() for w in words) else " ".join(lines)
                return f"Thanks for asking! From our shipping page: {best} Let us know if there is anything else."
        if articles:
            return f"Thanks for asking! {articles[0].get('text', '')}"
        return "I'm sorry, I could not find an answer in our knowledge base; a colleague will follow up with you."


def make_client(profile: Any, run: Any) -> DemoPlanner:
    return DemoPlanner()
