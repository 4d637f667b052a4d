from __future__ import annotations

from fastapi import APIRouter, Response, status
from sqlmodel import Session

from app.api.deps import DatabaseDep, PrincipalCacheDep, TokenAdmin
from app.api.params import TokenRefPath
from app.core.problems import problem_responses
from app.tokens import service
from app.tokens.models import TokenCreate, TokenCreated, TokenList, TokenPublic

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=problem_responses(401, 403, 422))


@router.post("", name="create", status_code=status.HTTP_201_CREATED, responses=problem_responses(409))
async def create_token(
    body: TokenCreate, db: DatabaseDep, principal: TokenAdmin, response: Response
) -> TokenCreated:
    """The secret is in this response only; the coordinator keeps its hash."""

    def work(session: Session) -> TokenCreated:
        token, secret = service.create_token(
            session, name=body.name, role=body.role, created_by=principal.name
        )
        return TokenCreated.of(token, token=secret)

    created = await db.run(work)
    response.headers["Location"] = f"/v1/tokens/{created.id}"
    return created


@router.get("", name="list")
async def list_tokens(db: DatabaseDep, _: TokenAdmin) -> TokenList:
    def work(session: Session) -> TokenList:
        rows = service.list_tokens(session)
        return TokenList(data=[TokenPublic.model_validate(r) for r in rows], count=len(rows))

    return await db.run(work)


@router.delete("/{token_id}", name="revoke", responses=problem_responses(404, 409))
async def revoke_token(
    token_id: TokenRefPath, db: DatabaseDep, cache: PrincipalCacheDep, _: TokenAdmin
) -> TokenPublic:
    """Revoked tokens stay listed (with `revoked_at`) and are refused from now on (by every coordinator
    within `EPCTL_AUTH_CACHE_S`). Accepts id or name. The last live admin token cannot be revoked
    (409 `last-admin-token`): create another first."""
    revoked = await db.run(
        lambda session: TokenPublic.model_validate(service.revoke_token(session, ref=token_id))
    )
    cache.clear()
    return revoked
