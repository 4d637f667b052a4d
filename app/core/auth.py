"""Roles and what they may do. Tokens carry one role; each role grants a set of permissions."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.core.errors import PermissionDeniedError


class TokenRole(StrEnum):  # the one role a token carries (`app.tokens` stores the tokens)
    admin = "admin"
    operator = "operator"
    autoscaler = "autoscaler"
    viewer = "viewer"


class Permission(StrEnum):
    read = "read"
    scale = "scale"  # request a reconfiguration
    cancel = "cancel"
    engines = "engines"  # register, heartbeat, deregister (agents hold an operator token)
    cleanup = "cleanup"  # retry or acknowledge a failed cleanup
    configure = "configure"  # deployments
    tokens = "tokens"
    webhooks = "webhooks"


ROLE_PERMISSIONS: dict[TokenRole, frozenset[Permission]] = {
    TokenRole.viewer: frozenset({Permission.read}),
    TokenRole.autoscaler: frozenset({Permission.read, Permission.scale}),
    TokenRole.operator: frozenset(
        {Permission.read, Permission.scale, Permission.cancel, Permission.engines, Permission.cleanup}
    ),
    TokenRole.admin: frozenset(Permission),
}


@dataclass(frozen=True)
class Principal:
    token_id: str
    name: str
    role: TokenRole

    def can(self, permission: Permission) -> bool:
        return permission in ROLE_PERMISSIONS[self.role]


def authorize(principal: Principal, permission: Permission) -> Principal:
    if not principal.can(permission):
        allowed = sorted(role.value for role, perms in ROLE_PERMISSIONS.items() if permission in perms)
        raise PermissionDeniedError(
            f"token {principal.name!r} has role {principal.role}; "
            f"{permission} needs one of: {', '.join(allowed)}",
            required_permission=permission.value,
            role=principal.role.value,
        )
    return principal
