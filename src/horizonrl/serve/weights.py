"""Which policies ``POST /v1/horizon/weights`` may swap in, and loading one.

A weight swap changes what every client of the server is answered by, and loading reads files on
the server, so it is guarded three ways (:class:`WeightSwaps`; the first two guard loading and
unloading LoRA adapters too, :mod:`horizonrl.serve.loras`):

- **a token**: a server started without ``--token`` refuses every swap (403), unless it was started
  on a loopback address with ``--allow-weight-swaps-without-token`` (the CLI checks the address);
- **checkpoint roots**: the checkpoint, resolved through symlinks, must lie under one of the roots
  the server was started with (``--checkpoint-root``; ``horizon serve`` adds the recipe's
  ``output_dir`` and its own ``--checkpoint``); anything else is 403, whether it exists or not;
- **nothing of the server's files in a reply**: a checkpoint that does not load is a 400 that
  names only what the client sent; why it did not load goes to the server's log.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from horizonrl.serve.protocol import APIError, bad_request

log = logging.getLogger(__name__)

#: what a checkpoint may be (as ``--checkpoint`` reads it)
ACCEPTED = "a run, checkpoint, policy, adapter or model directory of the served base model"


def shown(text: str) -> str:
    """``text`` quoted for a reply, cut at 200 characters."""
    return repr(text if len(text) <= 200 else text[:200] + "...")


@dataclass
class WeightSwaps:
    """How ``/v1/horizon/weights`` loads a policy: ``load_policy(path)`` (run in a worker thread)
    reads it and returns the update that puts it into the engine; ``roots`` are the directories
    checkpoints must lie under; ``without_token`` allows swaps on a server that has no token."""

    load_policy: Callable[[str], Callable[[], None]]
    roots: Sequence[Path] = ()
    without_token: bool = False
    _resolved: tuple[Path, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.roots = tuple(Path(r) for r in self.roots)
        self._resolved = tuple(Path(os.path.realpath(r)) for r in self.roots)

    def check_token(
        self, token_required: bool, what: str = "weight swaps", param: str = "checkpoint"
    ) -> None:
        """403 when the server has no token (``token_required`` false) and did not opt out."""
        if not token_required and not self.without_token:
            raise APIError(
                403,
                f"{what} need a token: start horizon serve with --token (or, on a loopback "
                "--host, with --allow-weight-swaps-without-token)",
                type="permission_error",
                param=param,
                code="weight_swaps_need_token",
            )

    def allowed_path(
        self, checkpoint: str, *, token_required: bool, what: str = "weight swaps", param: str = "checkpoint"
    ) -> Path:
        """The resolved directory ``checkpoint`` (the request's field ``param``) names, when this
        server may load it for ``what``; else the :class:`APIError` that says why (403 without a
        token or outside the roots, 400 not a path)."""
        self.check_token(token_required, what, param)
        try:
            resolved = Path(os.path.realpath(checkpoint))
        except (ValueError, OSError):  # a NUL byte, a name too long
            raise bad_request(
                f"{param} {shown(checkpoint)} is not a path", param=param, code=f"invalid_{param}"
            ) from None
        if not any(resolved.is_relative_to(root) for root in self._resolved):
            roots = ", ".join(str(r) for r in self.roots) or "none"
            raise APIError(
                403,
                f"{param} {shown(checkpoint)} is not under the allowed checkpoint roots [{roots}]; "
                "start horizon serve with --checkpoint-root DIR to allow another",
                type="permission_error",
                param=param,
                code="checkpoint_not_allowed",
            )
        return resolved

    async def load(self, checkpoint: str, path: Path) -> Callable[[], None]:
        """The update that swaps in the policy at ``path`` (what the client named ``checkpoint``); a
        400 naming only ``checkpoint`` when it does not load (the reason goes to the log)."""
        try:
            return await asyncio.to_thread(self.load_policy, str(path))
        except Exception as exc:  # a bad checkpoint: the serving weights stay as they are
            log.warning("POST /v1/horizon/weights: checkpoint %r did not load: %s", checkpoint, exc)
            raise bad_request(
                f"checkpoint {shown(checkpoint)} is not a checkpoint this server can load ({ACCEPTED}); "
                "the server's log says why",
                param="checkpoint",
                code="invalid_checkpoint",
            ) from None
