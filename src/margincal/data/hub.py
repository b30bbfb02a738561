"""Fail fast when a Hugging Face hub id cannot be fetched.

Without network, ``from_pretrained``/``load_dataset`` retry for minutes before failing. :func:`require_hub` checks
once per process (a 3-second TCP connect to the hub endpoint, skipped behind a proxy or with ``HF_HUB_OFFLINE=1``,
where the local HF cache answers) and stops at once with the local-path alternative. A hub id may carry a revision
(``org/model@v1``); :func:`pinned` resolves it to the commit hash that enters store keys and manifests.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from margincal.core.errors import InputError


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


HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}(?:@[\w./-]{1,200})?")


def could_be_hub_id(name: str) -> bool:
    """Whether ``name`` is spelled as a Hugging Face hub id (``org/name``, a legacy ``name``, an optional
    ``@revision``): ``runs/npo`` is, ``./runs/npo``, ``/abs/path`` and ``runs/npo/model`` are not."""
    return HUB_ID.fullmatch(name) is not None


def require_hub(name: str, alternative: str, local: str = "") -> None:
    """Raise :class:`HubUnreachableError` naming ``alternative`` when ``name`` (a hub id) cannot be fetched. ``local``
    (``directory``, ``file or directory``): the name was first looked for as a local path, so the message says that
    none exists before it speaks of the hub (``runs/npo``, a path mistyped, reads as a hub id too)."""
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    if offline or proxied or hub_reachable():
        return
    hub = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if local:
        raise HubUnreachableError(
            f"{name!r} is no local {local} (looked in {os.getcwd()}), and as a Hugging Face hub id it cannot be "
            f"fetched either: the hub ({hub}) cannot be reached from this machine. Check the path; for a hub id: "
            f"{alternative}"
        )
    raise HubUnreachableError(
        f"{name!r} is a Hugging Face hub id, but the hub ({hub}) cannot be reached from this machine. {alternative} "
        "If the files are already in the local HF cache, set HF_HUB_OFFLINE=1 to use them."
    )


def split_revision(name: str) -> tuple[str, str | None]:
    """``org/model@revision`` → (``org/model``, ``revision``); a name without ``@`` has no revision (None)."""
    repo, sep, revision = str(name).partition("@")
    if sep and not revision:
        raise InputError(f"{name!r}: give a revision after '@' (a branch, tag or commit hash), or none")
    return repo, (revision or None)


def _cached_commit(repo: str, revision: str) -> str | None:
    """The commit ``revision`` points to in the local Hugging Face cache (its ``refs/<revision>`` file), if cached."""
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "refs" / revision
    return ref.read_text().strip() if ref.is_file() else None


def pinned(repo: str, revision: str | None = None) -> str:
    """``repo@<commit>``: the commit hash ``revision`` (default ``main``) resolves to, from the hub or, offline, the
    local HF cache; a 40-hex revision is a commit already. When neither can answer (no hub, not cached) the name
    stays unpinned (``repo`` or ``repo@revision``): such a model cannot be loaded here either, so no stored result
    carries that key."""
    revision = revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return f"{repo}@{revision}"
    commit = _cached_commit(repo, revision)
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if commit is None and not offline and hub_reachable():
        from huggingface_hub import HfApi

        try:
            commit = HfApi().model_info(repo, revision=revision).sha
        except Exception as err:  # unknown repo or revision, gated, rate-limited
            raise InputError(f"could not resolve {repo}@{revision} on the Hugging Face hub: {err}") from None
    if commit is None:
        return repo if revision == "main" else f"{repo}@{revision}"
    return f"{repo}@{commit}"
