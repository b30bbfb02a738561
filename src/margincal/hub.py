"""Fail fast when a Hugging Face hub id cannot be fetched.

Without network, ``from_pretrained``/``load_dataset`` retry for minutes before failing. :func:`require_hub` checks
once per process (a 3-second TCP connect to the hub endpoint, skipped behind a proxy or with ``HF_HUB_OFFLINE=1``,
where the local HF cache answers) and stops at once with the local-path alternative.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse


class HubUnreachableError(FileNotFoundError):
    """A hub id was requested but the Hugging Face hub cannot be reached."""


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def require_hub(name: str, alternative: str) -> None:
    """Raise :class:`HubUnreachableError` naming ``alternative`` when ``name`` (a hub id) cannot be fetched."""
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    if offline or proxied or hub_reachable():
        return
    raise HubUnreachableError(
        f"{name!r} is a Hugging Face hub id, but the hub ({os.environ.get('HF_ENDPOINT', 'https://huggingface.co')}) "
        f"cannot be reached from this machine. {alternative} If the files are already in the local HF cache, set "
        "HF_HUB_OFFLINE=1 to use them."
    )
