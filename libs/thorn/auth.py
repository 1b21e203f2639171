"""Bearer tokens with roles. Tokens are random, so a SHA-256 digest is a safe stored form."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from thorn.model import TokenRole

TOKEN_PREFIX = "thn_"
BOOTSTRAP_TOKEN_NAME = "bootstrap-admin"

TokenLookup = Callable[[str], Awaitable[tuple[str, TokenRole] | None]]


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name (written to the audit log) and its role."""

    name: str
    role: TokenRole


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


_bearer = HTTPBearer(auto_error=False, description="an API token: `Authorization: Bearer thn_...`")


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"}
    )


async def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None:
        raise _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    lookup: TokenLookup = request.app.state.token_lookup
    found = await lookup(hash_token(credentials.credentials))
    if found is None:
        raise _unauthorized("invalid or revoked token")
    return Principal(*found)


def require(role: TokenRole) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits tokens with `role` or a stronger one."""

    async def check(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        if not principal.role.allows(role):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"token '{principal.name}' has role {principal.role.value}; "
                f"this needs {role.value} or higher",
            )
        return principal

    return check


Viewer = Annotated[Principal, Depends(require(TokenRole.viewer))]
Operator = Annotated[Principal, Depends(require(TokenRole.operator))]
Admin = Annotated[Principal, Depends(require(TokenRole.admin))]
