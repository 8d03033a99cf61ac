"""Trained weights synced to inference servers in other processes (``engine.kind: openai``) and to
vLLM in this process (``engine.kind: vllm``), right whatever stages the policy has.

**What a LoRA sync ships.** A run that warm-starts with SFT merges the SFT adapter into the
trainer's base and trains a fresh RL adapter on top, while the server still holds the original base.
Shipping the RL adapter alone would serve base + RL and silently drop what SFT taught. A LoRA sync
(``engine.weight_sync: vllm_lora``, and the vLLM engine) ships one adapter whose delta over the
served base is the whole policy's: the stages merged into the trainer's base and the adapter it
trains, concatenated (:func:`horizonrl.policy.concat_lora`; the ranks add up, e.g. SFT r 16 + RL r
16 = 32). The served policy is the trainer's up to rounding (the trainer merged the earlier stages
in its dtype; the server adds their delta on the fly). A server whose largest LoRA rank is below the
sum refuses the load, and the sync stops training with the server's reason. Full fine-tuning has no
adapter to ship: the recipe check refuses ``vllm_lora`` with ``model.finetune: full``.

**Versions.** Every sync is a new version. A LoRA version is served under a name of its own
(:meth:`LoraVersions.name`) that each request names, so a completion comes from the version it asked
for, and a server that did not load that version answers 404: a missed sync is an error, never a
sample of stale weights. The newest ``keep`` versions stay loaded (requests in flight during a sync
finish on the one before), older ones are unloaded. A whole-policy sync (``horizon``) swaps the
weights of ``horizon serve``, which reports the version each completion was sampled from
(:class:`ServerVersions`); a version this run did not sync (a restarted server, another client's
swap) is an error.

**Servers.** ``engine.base_url`` names one server or a list. Every version goes to every server
(:class:`Server`), and a sync that any server refuses stops training with one line naming that
server; the run's last checkpoint stays as it was.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from horizonrl.errors import HorizonError
from horizonrl.policy import AdapterStage, concat_lora, stage_from_peft, write_adapter

_FINGERPRINT = re.compile(r"horizonrl-w(\d+)$")


def policy_adapter(policy: Any, stages: Sequence[AdapterStage]) -> AdapterStage | None:
    """The one LoRA adapter whose delta over the original base is ``policy``'s: ``stages`` (the
    adapters merged into ``policy``'s base, in order) and ``policy``'s own adapter when it is a PEFT
    model, concatenated; None when ``policy`` is the original base itself (no stages, no adapter)."""
    parts = list(stages)
    if hasattr(policy, "peft_config"):
        parts.append(stage_from_peft(policy, "rl"))
    return concat_lora(parts, name="policy") if parts else None


def write_policy_adapter(
    out: Path, policy: Any, stages: Sequence[AdapterStage], base_name: str
) -> AdapterStage | None:
    """Write :func:`policy_adapter` as a PEFT adapter directory ``out``; None (nothing written)
    when the policy is the base itself."""
    adapter = policy_adapter(policy, stages)
    if adapter is not None:
        write_adapter(out, adapter, base_name)
    return adapter


class LoraVersions:
    """The adapter names of a run's LoRA versions on its servers and which to unload: the newest
    ``keep`` stay loaded. Names carry a token of this run, so two runs sharing a server never clash."""

    def __init__(self, keep: int = 2, token: str | None = None) -> None:
        if keep < 1:
            raise ValueError("keep at least the newest version loaded")
        self.keep = keep
        self.token = token or uuid.uuid4().hex[:8]
        self.loaded: list[int] = []
        #: versions whose unload a server refused (in use): tried again after the next sync
        self.retry: set[int] = set()

    def name(self, version: int) -> str:
        return f"policy-{self.token}-v{version}"

    def version_of(self, name: str) -> int | None:
        prefix = f"policy-{self.token}-v"
        return int(name[len(prefix) :]) if name.startswith(prefix) and name[len(prefix) :].isdigit() else None

    def add(self, version: int) -> list[int]:
        """Record ``version`` as loaded; the versions to unload now (oldest first)."""
        self.loaded.append(version)
        old = self.loaded[: -self.keep]
        self.loaded = self.loaded[-self.keep :]
        stale = sorted(self.retry | set(old))
        self.retry.clear()
        return stale


@dataclass
class ServerVersions:
    """A ``horizon serve`` server's own weights versions mapped to the run's: the server counts its
    swaps, the run counts its syncs; the first version seen before any sync is the run's 0."""

    url: str
    to_run: dict[int, int] = field(default_factory=dict)

    def synced(self, served: int, version: int) -> None:
        self.to_run[served] = version

    def run_version(self, fingerprint: str | None, synced_any: bool) -> int | None:
        """The run's version of a completion whose ``system_fingerprint`` is ``fingerprint``; None
        when the server reports none (not ``horizon serve``). HorizonError for a version this run did
        not sync."""
        match = _FINGERPRINT.match(fingerprint or "")
        if match is None:
            return None
        served = int(match.group(1))
        if served not in self.to_run:
            if not synced_any and not self.to_run:
                self.to_run[served] = 0
                return 0
            raise HorizonError(
                f"engine.kind openai: {self.url} sampled from its weights version {served}, which this run "
                f"did not sync (synced: {sorted(self.to_run)}); was the server restarted or its weights "
                "swapped by another client? Each run needs servers of its own"
            )
        return self.to_run[served]


@dataclass
class Server:
    """One server behind a run: its ``/v1`` URL, the requests in flight, its versions."""

    url: str
    in_flight: int = 0
    versions: ServerVersions = field(init=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.versions = ServerVersions(self.url)

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


def post_json(server: Server, path: str, body: dict[str, Any], api_key: str, what: str) -> dict[str, Any]:
    """POST ``body`` to ``server``'s ``path``; the reply's JSON, or HorizonError naming the server
    and its reason (one line)."""
    import httpx

    url = f"{server.root}{path}"
    try:
        reply = httpx.post(url, json=body, headers={"Authorization": f"Bearer {api_key}"}, timeout=600)
    except httpx.HTTPError as exc:
        raise HorizonError(f"{what}: {url} did not answer: {type(exc).__name__}: {exc}") from None
    if reply.status_code >= 400:
        raise HorizonError(f"{what}: {url} refused it ({reply.status_code}): {_reason(reply)}")
    try:
        data = reply.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _reason(reply: Any) -> str:
    try:
        data = reply.json()
    except ValueError:
        return reply.text[:300]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:300]
        if "detail" in data:
            return str(data["detail"])[:300]
    return reply.text[:300]


def missed_sync(server: Server, model: str, exc: Exception) -> HorizonError:
    """The error of a request whose version a server does not hold (a 404 naming its model)."""
    return HorizonError(
        f"engine.kind openai: {server.url} does not serve {model!r}: it missed a weight sync (restarted, "
        "or engine.base_url is a load balancer: list every server in engine.base_url so each gets "
        f"every version): {exc}"
    )
