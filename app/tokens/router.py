from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.deps import SessionDep, TokenAdmin
from app.core.problems import problem_responses
from app.tokens import service
from app.tokens.models import TokenCreate, TokenCreated, TokenList, TokenPublic

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=problem_responses(401, 403, 422))


@router.post("", name="create", status_code=status.HTTP_201_CREATED, responses=problem_responses(409))
def create_token(
    body: TokenCreate, session: SessionDep, principal: TokenAdmin, response: Response
) -> TokenCreated:
    """The secret is in this response only; the coordinator keeps its hash."""
    token, secret = service.create_token(session, name=body.name, role=body.role, created_by=principal.name)
    response.headers["Location"] = f"/v1/tokens/{token.id}"
    return TokenCreated(**TokenPublic.from_row(token).model_dump(), token=secret)


@router.get("", name="list")
def list_tokens(session: SessionDep, _: TokenAdmin) -> TokenList:
    rows = service.list_tokens(session)
    return TokenList(data=[TokenPublic.from_row(r) for r in rows], count=len(rows))


@router.delete("/{token_id}", name="revoke", responses=problem_responses(404))
def revoke_token(token_id: str, session: SessionDep, _: TokenAdmin) -> TokenPublic:
    """Revoked tokens stay listed (with `revoked_at`) and are refused from now on. Accepts id or name."""
    return TokenPublic.from_row(service.revoke_token(session, ref=token_id))
