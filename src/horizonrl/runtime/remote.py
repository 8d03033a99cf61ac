"""The driver's side of the Ray workers: an :class:`~horizonrl.envs.base.Env` whose episode lives
in an env-worker actor (:class:`RemoteEnv`), and an engine that routes generation to engine-replica
actors (:class:`EngineRouter`). The agent loop and the trainer use them as they use the in-process
ones."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.envs.base import Env
from horizonrl.types import Action, Message, StepResult, Task, ToolSpec


class WorkerLost(RuntimeError):
    """A worker actor died (its node went away, it was killed, it ran out of memory)."""


class RemoteEnv(Env):
    """One episode's env, made and held by an env worker; every method is a call to it."""

    def __init__(self, worker: Any, pool: EnvPool) -> None:
        super().__init__()
        self.worker = worker
        self.pool = pool
        self.env_id = uuid.uuid4().hex
        self.name = ""  # type: ignore[misc]  # the worker's env class says (after reset)
        self.accepts_text = False  # type: ignore[misc]
        self.text_actions = False  # type: ignore[misc]

    async def _call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        try:
            return await getattr(self.worker, method).remote(*args)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            self.pool.lost(self.worker)
            raise WorkerLost(f"the env worker holding this episode died during {method}: {exc}") from None

    async def reset(self, task: Task) -> list[Message]:
        self.pool.opened(self.worker)
        made = await self._call("reset", self.env_id, task.model_dump())
        self.name = made["name"]  # type: ignore[misc]
        self.accepts_text = made["accepts_text"]  # type: ignore[misc]
        self.text_actions = made["text_actions"]  # type: ignore[misc]
        self.tools = [ToolSpec.model_validate(t) for t in made["tools"]]
        self.metrics = made["metrics"]
        return [Message.model_validate(m) for m in made["messages"]]

    async def step(self, action: Action) -> StepResult:
        out = await self._call("step", self.env_id, action.model_dump())
        self.metrics = out["metrics"]
        return StepResult.model_validate(out["result"])

    async def evaluate(self) -> float | None:
        out = await self._call("evaluate", self.env_id)
        self.metrics = out["metrics"]
        return out["outcome"]

    async def close(self) -> None:
        try:
            await self._call("close", self.env_id)
        finally:
            self.pool.closed(self.worker)


class EnvPool:
    """The env workers, and how many envs each holds (a new env goes to the least loaded)."""

    def __init__(self, workers: Sequence[Any]) -> None:
        self.workers = list(workers)
        self.load: dict[Any, int] = {w: 0 for w in self.workers}
        self.lost_workers = 0
        self.on_lost: Any = None  # a function that starts a replacement worker (or None)

    def factory(self) -> RemoteEnv:
        if not self.workers:
            raise WorkerLost("every env worker has died")
        worker = min(self.workers, key=lambda w: self.load[w])
        return RemoteEnv(worker, self)

    def opened(self, worker: Any) -> None:
        self.load[worker] = self.load.get(worker, 0) + 1

    def closed(self, worker: Any) -> None:
        if worker in self.load:
            self.load[worker] = max(0, self.load[worker] - 1)

    def lost(self, worker: Any) -> None:
        if worker in self.workers:
            self.workers.remove(worker)
            self.load.pop(worker, None)
            self.lost_workers += 1
            if self.on_lost is not None:
                replacement = self.on_lost()
                if replacement is not None:
                    self.workers.append(replacement)
                    self.load[replacement] = 0


class EngineRouter:
    """An Engine over engine-replica actors. A new conversation goes to the replica with the fewest
    requests in flight; later turns of a conversation (a prompt that extends what an earlier request
    of it sent and got back) go to the same replica, whose conversation cache holds it. A request
    whose replica died is retried on another (``max_retries``; counted in ``stats``).

    ``update_weights(policy)`` copies the policy's plain weights into every replica (through the
    object store, once for all) and waits until all hold them; the router then reports the new
    ``weights_version``, and every completion records the version it was sampled from."""

    def __init__(
        self,
        replicas: Sequence[Any],
        info: dict[str, Any],
        tokenizer: Any,
        *,
        max_retries: int = 2,
        dtype: Any = None,
    ) -> None:
        self.replicas = list(replicas)
        self.tokenizer = tokenizer
        self.max_context = int(info["max_context"])
        self.eos_token_ids = frozenset(info["eos_token_ids"])
        self.vocab_size = int(info["vocab_size"])
        self.pad_token_id = int(info["pad_token_id"])
        self.max_retries = max_retries
        self.dtype = dtype
        self.weights_version = 0
        self.in_flight: dict[Any, int] = {r: 0 for r in self.replicas}
        self._sticky: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._lengths: dict[int, int] = {}  # lengths of the remembered sequences (how many of each)
        self._sticky_cap = 4096
        self.retries = 0
        self.lost_replicas = 0
        self.routed_sticky = 0
        self.routed_new = 0
        self.on_lost: Any = None  # a function that starts a replacement replica (or None)
        self.last_state: Any = None  # the object-store ref of the latest weights (for replacements)

    # ---------------------------------------------------------------------------- routing
    def _key(self, ids: Sequence[int]) -> tuple[int, ...]:
        return (*ids[-64:], len(ids))

    def _route(self, prompt: list[int]) -> Any:
        """The replica for ``prompt``: the one that answered the turn it extends, else the least busy."""
        for cut in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            replica = self._sticky.get(self._key(prompt[:cut]))
            if replica is not None and replica in self.in_flight:
                self.routed_sticky += 1
                return replica
        self.routed_new += 1
        return min(self.replicas, key=lambda r: self.in_flight[r])

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Completion:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        for attempt in itertools.count():
            if not self.replicas:
                raise WorkerLost("every engine replica has died")
            replica = (
                self._route(prompt) if attempt == 0 else min(self.replicas, key=lambda r: self.in_flight[r])
            )
            self.in_flight[replica] += 1
            try:
                out = await replica.generate.remote(prompt, params.model_dump())
            except (ActorDiedError, ActorUnavailableError, RayActorError):
                self._lose(replica)
                if attempt >= self.max_retries:
                    raise WorkerLost(f"engine replicas died {attempt + 1} times for one request") from None
                self.retries += 1
                continue
            finally:
                if replica in self.in_flight:
                    self.in_flight[replica] -= 1
            completion = Completion.model_validate(out)
            self._remember(prompt + list(completion.token_ids), replica)
            return completion
        raise AssertionError("unreachable")  # pragma: no cover

    def _remember(self, sequence: list[int], replica: Any) -> None:
        key = self._key(sequence)
        if key not in self._sticky:
            self._lengths[len(sequence)] = self._lengths.get(len(sequence), 0) + 1
        self._sticky[key] = replica
        self._sticky.move_to_end(key)
        while len(self._sticky) > self._sticky_cap:
            old, _ = self._sticky.popitem(last=False)
            self._forget_length(old[-1])

    def _forget_length(self, n: int) -> None:
        left = self._lengths.get(n, 0) - 1
        if left > 0:
            self._lengths[n] = left
        else:
            self._lengths.pop(n, None)

    def _lose(self, replica: Any) -> None:
        if replica in self.replicas:
            self.replicas.remove(replica)
            self.in_flight.pop(replica, None)
            self.lost_replicas += 1
            if self.on_lost is not None:
                replacement = self.on_lost(self.weights_version)
                if replacement is not None:
                    self.replicas.append(replacement)
                    self.in_flight[replacement] = 0

    # ---------------------------------------------------------------------------- weights
    def update_weights(self, policy: Any, stages: Sequence[Any] = ()) -> None:
        """Copy ``policy`` into every replica; returns once all hold the new version."""
        import ray

        from horizonrl.engine.weights import plain_state_dict

        start = time.perf_counter()
        state = ray.put(plain_state_dict(policy, self.dtype))
        self.last_state = state
        version = self.weights_version + 1
        ray.get([r.update_weights.remote(state, version) for r in self.replicas])
        self.weights_version = version
        self._sticky.clear()  # the replicas' conversation caches are stale now
        self._lengths.clear()
        self.last_sync_s = time.perf_counter() - start

    last_sync_s: float = 0.0

    def drop_caches(self) -> None:
        import ray

        ray.get([r.drop_caches.remote() for r in self.replicas])

    @property
    def stats(self) -> dict[str, float]:
        import ray

        per = ray.get([r.stats.remote() for r in self.replicas]) if self.replicas else []
        keys = (
            "requests",
            "prompt_tokens",
            "generated_tokens",
            "decode_steps",
            "decode_rows",
            "generate_s",
            "batches",
            "errors",
            "admitted_requests",
            "prefix_reused_tokens",
            "conversation_reused_tokens",
        )
        out: dict[str, float] = {k: float(sum(p.get(k, 0.0) for p in per)) for k in keys}
        out["mean_batch_size"] = out["decode_rows"] / out["decode_steps"] if out["decode_steps"] else 0.0
        out["tokens_per_s"] = out["generated_tokens"] / out["generate_s"] if out["generate_s"] else 0.0
        out.update(
            replicas=float(len(self.replicas)),
            lost_replicas=float(self.lost_replicas),
            retries=float(self.retries),
            routed_sticky=float(self.routed_sticky),
            routed_new=float(self.routed_new),
            weights_version=float(self.weights_version),
        )
        return out

    async def close(self) -> None:
        return None
