"""Who may call the server: API keys as vLLM's ``--api-key`` does them, and a refusal to expose GPUs.

With a key configured (``api_key`` or the environment variable named by ``api_key_env``), every
``/v1/*`` route needs ``Authorization: Bearer <key>`` and answers 401 without it; ``/health`` stays open
for Serve's probes. A server bound to a non-loopback address without a key refuses to start, unless the
config opts out with ``allow_unauthenticated: true``.
"""
from __future__ import annotations

import hmac
import ipaddress
import os

from actors.serving.openai.protocol import OpenAIError

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def resolve_api_key(api_key: str | None, api_key_env: str | None) -> str | None:
    """The configured key, else the environment variable's value, else None (no authentication)."""
    if api_key:
        return api_key
    value = os.environ.get(api_key_env) if api_key_env else None
    return value or None


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str | None, api_key: str | None, allow_unauthenticated: bool) -> None:
    """Refuse to serve a non-loopback address without a key (``host`` None: unknown, treated as exposed)."""
    if api_key is None and not allow_unauthenticated and not is_loopback(host):
        raise ValueError(
            f"refusing to start: the server binds {host or 'an unknown address'!r}, reachable beyond this "
            "machine, and no API key is set, so anyone who reaches the cluster could use its GPUs. Set "
            "api_key_env (default BLOCKSERVE_API_KEY) or api_key, bind 127.0.0.1, or opt out with "
            "allow_unauthenticated: true")


def authorize(authorization: str | None, api_key: str | None) -> None:
    """Raise a 401 unless ``authorization`` is ``Bearer <api_key>`` (nothing to check without a key)."""
    if api_key is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise OpenAIError("invalid or missing API key: send 'Authorization: Bearer <key>'", status=401,
                          code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def serve_http_host() -> str | None:
    """The address Ray Serve's HTTP proxy binds, read from the running Serve instance (None if unknown)."""
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception:  # not under Serve, or an internal API that moved: unknown means exposed
        return None
