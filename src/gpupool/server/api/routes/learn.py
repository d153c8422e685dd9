"""The learners: their status, the history the job order's replay needs, promote and demote
(admin). The server cannot simulate: `gpupool learn promote` replays and sends the job
order's evidence; a learner judged by its own guard (the demand forecast, the co-location
admission) is promoted on the record the server holds."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from gpupool.server.api.deps import Live, Who, admin_only
from gpupool.server.api.schemas import DemoteIn, PromoteIn

router = APIRouter()


@router.get("/v1/learn", summary="The learned policy: data seen, accuracy, guard, mode")
def learn(who: Who, service: Live) -> dict[str, Any]:
    return service.views.learning_view()


@router.get("/v1/learn/history", summary="Jobs finished in the last N days, and the fleet")
def learn_history(
    who: Who,
    service: Live,
    days: Annotated[float, Query(gt=0, le=3650, allow_inf_nan=False)] = 14.0,
) -> dict[str, Any]:
    return service.views.learning_history(days)


@router.post("/v1/learn/promote", summary="Make the learned policy active on a replay win (admin)")
def learn_promote(body: PromoteIn, who: Who, service: Live) -> dict[str, Any]:
    admin_only(who, "promotes the learned policy")
    return service.operations.promote_learning(body.evidence.model_dump(), who.name)


@router.post("/v1/learn/demote", summary="Return the learned policy to shadow (admin)")
def learn_demote(who: Who, service: Live, body: DemoteIn | None = None) -> dict[str, Any]:
    admin_only(who, "demotes the learned policy")
    return service.operations.demote_learning(who.name, body.reason if body is not None else "")


GuardedLearner = Literal["forecast", "colocation"]
"""The learners a server promotes on its own record (learning.config.LEARNERS less the job
order, whose evidence is a replay)."""


@router.post(
    "/v1/learn/{learner}/promote",
    summary="Make a guard-judged learner active, if its record carries it (admin)",
)
def learner_promote(learner: GuardedLearner, who: Who, service: Live) -> dict[str, Any]:
    admin_only(who, f"promotes the {learner} learner")
    return service.operations.promote_learner(learner, who.name)


@router.post(
    "/v1/learn/{learner}/demote", summary="Return a guard-judged learner to shadow (admin)"
)
def learner_demote(
    learner: GuardedLearner, who: Who, service: Live, body: DemoteIn | None = None
) -> dict[str, Any]:
    admin_only(who, f"demotes the {learner} learner")
    reason = body.reason if body is not None else ""
    return service.operations.demote_learner(learner, who.name, reason)
