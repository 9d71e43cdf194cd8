"""A test identity provider: each token is a named user, as under JupyterHub.

`--ServerApp.identity_provider_class=identity.TokenUsers --TokenUsers.users={"tok-a": "alice"}`
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.identity import IdentityProvider, User
from traitlets import Dict


class TokenUsers(IdentityProvider):
    users = Dict(config=True, help="token -> user name")

    @property
    def auth_enabled(self) -> bool:
        return True

    def get_user(self, handler: Any) -> User | None:
        token = self.get_token(handler)
        name = self.users.get(token or "")
        if not name:
            return None
        handler._token_authenticated = True  # token requests need no XSRF cookie
        return User(username=name, name=name, display_name=name)


def token_users_config(server_config: dict[str, Any], tokens: dict[str, str], own_token: str) -> dict[str, Any]:
    """An in-process server's config (pytest-jupyter's `jp_server_config`) where each of
    `tokens` is a user, and the fixtures' own token (`jp_fetch`, `api`) is `own_token`."""
    return {**server_config,
            "ServerApp": {**server_config["ServerApp"], "identity_provider_class": "identity.TokenUsers"},
            "IdentityProvider": {"token": own_token},
            "TokenUsers": {"users": tokens}}
