"""/api/approvals: list the approvals a caller may read and decide them."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from agents import access
from agents.actions import claims
from agents.actions.approvals import approval_batch_decide, approval_decide
from agents.actions.base import ActionError
from agents.api.errors import ERRORS, forbidden, plain
from agents.api.listing import OLDEST_FIRST, ApprovalPageQuery, approval_filters, page
from agents.api.schemas import ApprovalOut, ApprovalPage, BatchDecisionIn, BatchDecisionOut, DecisionIn, Error

router = Router()


@router.get("/approvals", response={200: ApprovalPage, ERRORS: Error}, summary="Approvals, oldest first")
def approvals_list(request: HttpRequest, filters: Query[ApprovalPageQuery]) -> dict[str, Any]:
    """Approvals of the runs the caller may read, oldest first (the queue's order), a
    page at a time: `next` is the cursor for `?after=`, null on the last page. `status`
    and `tool` filter the approvals; `state`, `agent`, `launched_by` and `q` their runs;
    `since` and `until` when the approval was made."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.may_read_runs(user):
        raise forbidden("reading approvals needs the reviewer, operator or launcher role")
    params = filters.model_dump()
    approvals = access.visible_approvals(user).filter(approval_filters(params))
    approvals = approvals.select_related("decided_by", "edited_by", "claimed_by").prefetch_related("votes")
    return page(approvals, params, OLDEST_FIRST, lambda a: dict(a.to_dict()))


@router.get("/approvals/{int:approval_id}", response={200: ApprovalOut, ERRORS: Error}, summary="One approval")
def approvals_get(request: HttpRequest, approval_id: int) -> dict[str, Any]:
    """One approval in any status, exactly as an item of `GET /api/approvals` (the
    `approval_id` webhooks and the gateway hand out). The same 404 for an id that names
    no approval and for one outside the caller's projects or runs."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.may_read_runs(user):
        raise forbidden("reading approvals needs the reviewer, operator or launcher role")
    found = None
    if 0 < approval_id <= access.MAX_ID:
        approvals = access.visible_approvals(user).select_related("decided_by", "edited_by", "claimed_by")
        found = approvals.prefetch_related("votes").filter(pk=approval_id).first()
    if found is None:
        raise ActionError("not_found", f"no approval {approval_id}", status=404)
    return dict(found.to_dict())


@router.post(
    "/approvals/{int:approval_id}/decision", response={200: ApprovalOut, ERRORS: Error}, summary="Decide an approval"
)
def approvals_decide(request: HttpRequest, approval_id: int, payload: DecisionIn) -> dict[str, Any]:
    """The answer that decides wins. Repeating it (a retry, a second reviewer agreeing)
    returns the recorded decision unchanged; a contradicting answer is a 409 naming who
    decided. An approval that needs several votes answers with the votes so far; a
    reviewer voting again gets their vote back (a 409 if they now answer otherwise).
    `args_hash` binds the answer to the call the caller saw: a 409 `call_changed` when
    it changed since, or when someone edited it and the answer names no hash."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_decide(user):
        raise forbidden("deciding approvals needs the reviewer role")
    if not 0 < approval_id <= access.MAX_ID:
        raise ActionError("not_found", f"no approval {approval_id}", status=404)
    result = approval_decide(
        approval_id=approval_id, user=user, decision=payload.decision, note=payload.note, args=payload.args,
        remember=payload.remember, args_hash=payload.args_hash, via="api", by_reviewer=True,
    )
    approval = result.approval
    if result.outcome == "late" and approval.decision != payload.decision:
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        raise ActionError(
            "already_decided",
            {"message": f"already {approval.status_text} by {who}", "approval": plain(approval.to_dict())},
            status=409,
        )
    if result.outcome == "already_voted":
        mine = next((v for v in approval.current_votes() if v.by_id == user.pk), None)
        if mine is not None and mine.decision != payload.decision:
            raise ActionError(
                "already_voted",
                {"message": f"you already voted {mine.decision}", "approval": plain(approval.to_dict())},
                status=409,
            )
    return dict(approval.to_dict())


@router.post("/approvals/decisions", response={200: BatchDecisionOut, ERRORS: Error}, summary="Decide several approvals")
def approvals_decide_batch(request: HttpRequest, payload: BatchDecisionIn) -> dict[str, Any]:
    """Approve or reject the listed approvals with one note: each id is decided as a
    single decision would be (its own vote, compare-and-set and transition), and the
    answer says what became of each, in the order given: `decided`, `already_decided`
    (someone answered first, or it is no longer pending), `refused` (separation of
    duties, a changed call, not found; see `detail`) or `needs_more_votes` (the vote is
    recorded; a two-person rule waits for another reviewer). No edits, no grants."""
    user = request.auth  # type: ignore[attr-defined]
    if not access.can_decide(user):
        raise forbidden("deciding approvals needs the reviewer role")
    results = approval_batch_decide(
        approval_ids=payload.ids, user=user, decision=payload.decision, note=payload.note,
        args_hashes=payload.hashes(), via="api",
    )
    return {"results": [r.to_dict() for r in results]}
@router.post("/approvals/{int:approval_id}/claim", response={200: ApprovalOut, ERRORS: Error}, summary="Claim an approval")
def approvals_claim(request: HttpRequest, approval_id: int) -> dict[str, Any]:
    """Say "I'm on it" for AIRLOCK_CLAIM_MINUTES (claiming again extends it). A claim
    only tells: it never stops another reviewer from deciding. 409 `claimed` (with
    `claimed_by` and `claimed_until`) while another reviewer's claim is live, 409
    `not_pending` once the call is decided."""
    user = request.auth  # type: ignore[attr-defined]
    return dict(claims.approval_claim(approval_id=approval_id, user=user).to_dict())


@router.post(
    "/approvals/{int:approval_id}/release", response={200: ApprovalOut, ERRORS: Error}, summary="Release a claim"
)
def approvals_release(request: HttpRequest, approval_id: int) -> dict[str, Any]:
    """Let go of your claim. Releasing a call nobody holds answers with it unchanged;
    another reviewer's claim is a 409 `not_claimant` (superusers may release anyone's)."""
    user = request.auth  # type: ignore[attr-defined]
    return dict(claims.approval_release(approval_id=approval_id, user=user).to_dict())
