"""The LoRA adapters ``horizon serve`` serves over its base model, as vLLM's OpenAI server serves
them: ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``, ``POST /v1/unload_lora_adapter
{"lora_name"}``, each adapter listed by ``GET /v1/models`` (``root``: its path, ``parent``: the
base) and chosen per request by ``model``.

The engine serves them itself (``HFEngine.add_adapter``): requests of different adapters and of
the base are decoded in the same batches. A client's name is not the engine's: each load gets an
engine name of its own (``adapter1``, ``adapter2``, ...), so any name (dots, slashes) can name an
adapter, and a name unloaded and loaded again never meets its old weights' requests.

- **Loading** (:meth:`ServedLoras.load`) checks the directory against the base (target modules and
  shapes, readable safetensors) before anything changes; a name already loaded is a 400 unless
  ``load_inplace`` replaces it, and past ``max_loras`` adapters a load is a 400.
- **Unloading** (:meth:`ServedLoras.unload`) takes the name out at once (new requests naming it are
  404), waits until the requests already admitted under it have finished (nothing is cut off), then
  removes it from the engine, which frees its weights.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.engine.base import serves_adapters
from horizonrl.serve.protocol import APIError, ModelCard, bad_request
from horizonrl.serve.weights import shown

log = logging.getLogger(__name__)

DEFAULT_MAX_LORAS = 8
"""How many LoRA adapters ``horizon serve`` holds at once unless ``--max-loras`` says otherwise."""

#: how long an unload waits for the engine to let go of cancelled requests of the adapter
_RELEASE_WAIT_S = 30.0


class LoadLoraAdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter`` (vLLM's body)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=256, description="The model id requests name it by.")
    lora_path: str = Field(
        min_length=1, max_length=4096, description="A PEFT LoRA adapter directory under a checkpoint root."
    )
    load_inplace: bool = Field(False, description="Replace the adapter of that name if one is loaded.")


class UnloadLoraAdapterRequest(BaseModel):
    """``POST /v1/unload_lora_adapter`` (vLLM's body; ``lora_int_id`` is accepted, the name decides)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None


@dataclass
class ServedLora:
    """One adapter served: the name clients use, the path it was loaded from (as given), its name
    in the engine."""

    name: str
    path: str
    engine_name: str
    created: int


class ServedLoras:
    """The adapters served over ``engine``'s base model ``base_name``, at most ``max_loras`` (see
    the module doc). Used from the app's event loop."""

    def __init__(self, engine: Any, base_name: str, max_loras: int = DEFAULT_MAX_LORAS) -> None:
        self.engine, self.base_name, self.max_loras = engine, base_name, max_loras
        self._served: dict[str, ServedLora] = {}
        self._running: Counter[str] = Counter()  # engine name -> choices admitted under it
        self._draining: dict[str, asyncio.Event] = {}  # engine names being unloaded
        self._changes = asyncio.Lock()  # one load or removal at a time
        self._removals: set[asyncio.Future[None]] = set()
        self._ids = itertools.count(1)

    @property
    def supported(self) -> bool:
        """Whether the engine serves adapters (the in-process engine, ``engine.kind: hf``)."""
        return serves_adapters(self.engine)

    @property
    def names(self) -> list[str]:
        return list(self._served)

    # ------------------------------------------------------------------------ requests
    def resolve(self, model: str) -> str | None:
        """The engine adapter a request's ``model`` names (None: the base model); 404 otherwise."""
        if model == self.base_name:
            return None
        lora = self._served.get(model)
        if lora is None:
            adapters = f" and the LoRA adapters {_listed(self._served)}" if self._served else ""
            raise APIError(
                404,
                f"The model `{model}` does not exist; this server serves '{self.base_name}'{adapters}",
                param="model",
                code="model_not_found",
            )
        return lora.engine_name

    def cards(self, created: int) -> list[ModelCard]:
        """``GET /v1/models``: the base, then each adapter (``root`` its path, ``parent`` the base)."""
        base = ModelCard(id=self.base_name, created=created)
        return [base] + [
            ModelCard(id=a.name, created=a.created, root=a.path, parent=self.base_name)
            for a in self._served.values()
        ]

    def hold(self, adapter: str | None, n: int) -> None:
        """Count ``n`` choices in under ``adapter``; 404 when it was unloaded since they named it."""
        if adapter is None:
            return
        if adapter in self._draining or all(a.engine_name != adapter for a in self._served.values()):
            raise APIError(
                404, "The model was unloaded while the request waited", param="model", code="model_not_found"
            )
        self._running[adapter] += n

    def let_go(self, adapter: str | None, n: int) -> None:
        if adapter is None:
            return
        self._running[adapter] -= n
        if self._running[adapter] <= 0:
            del self._running[adapter]
            if adapter in self._draining:
                self._draining[adapter].set()

    # ------------------------------------------------------------------------ loading
    def preload(self, name: str, folder: Path) -> None:
        """Serve the adapter in ``folder`` as ``name`` before the server answers (``--lora-modules``);
        ValueError (one line) when it cannot be."""
        try:
            self._check_load(name, inplace=False)
        except APIError as exc:
            raise ValueError(exc.message) from None
        engine_name = f"adapter{next(self._ids)}"
        self.engine.add_adapter(engine_name, folder)
        self._served[name] = ServedLora(name, str(folder), engine_name, int(time.time()))

    async def load(self, name: str, path: str, folder: Path, *, inplace: bool = False) -> None:
        """Serve the adapter at ``folder`` (what the client named ``path``) as ``name``; an
        :class:`APIError` that says why not, with nothing changed."""
        if not self.supported:
            raise bad_request(
                "this server's engine cannot serve LoRA adapters (engine.kind hf serves them)",
                param="lora_name",
                code="lora_not_supported",
            )
        async with self._changes:
            self._check_load(name, inplace)
            if not folder.is_dir():
                raise APIError(
                    404,
                    f"LoRA adapter path {shown(path)} is not a directory",
                    type="not_found_error",
                    param="lora_path",
                    code="lora_path_not_found",
                )
            old = self._served.get(name)
            engine_name = old.engine_name if old is not None else f"adapter{next(self._ids)}"
            try:
                await asyncio.to_thread(self.engine.add_adapter, engine_name, folder)
            except ValueError as exc:  # not an adapter of this base: the engine changed nothing
                if old is not None and engine_name not in self.engine.adapters:  # PEFT failed midway
                    del self._served[name]
                reason = str(exc).removeprefix(f"add_adapter: {folder}: ").replace(str(folder), path)
                log.warning("POST /v1/load_lora_adapter: %r did not load: %s", path, exc)
                raise bad_request(
                    f"LoRA adapter {shown(path)} cannot be served on this base model: {reason}",
                    param="lora_path",
                    code="invalid_lora_adapter",
                ) from None
            self._served[name] = ServedLora(name, path, engine_name, int(time.time()))

    def _check_load(self, name: str, inplace: bool) -> None:
        """400 when ``name`` may not be loaded (the base's name, loaded already, past the limit)."""
        if name == self.base_name:
            raise bad_request(
                f"the LoRA adapter name {shown(name)} is the base model's; choose another",
                param="lora_name",
                code="invalid_lora_name",
            )
        if name in self._served and not inplace:
            raise bad_request(
                f"The LoRA adapter {shown(name)} has already been loaded; unload it first, or set "
                "'load_inplace': true to replace it",
                param="lora_name",
                code="lora_already_loaded",
            )
        held = len(self._served) + len(self._draining)
        if name not in self._served and held >= self.max_loras:
            raise bad_request(
                f"{held} LoRA adapters are loaded, the most this server holds (--max-loras "
                f"{self.max_loras}): unload one first (POST /v1/unload_lora_adapter), then load "
                f"{shown(name)}",
                param="lora_name",
                code="lora_limit_reached",
            )

    # ------------------------------------------------------------------------ unloading
    async def unload(self, name: str) -> None:
        """Stop serving ``name`` (see the module doc); 404 when no adapter has that name."""
        lora = self._served.pop(name, None)
        if lora is None:
            loaded = _listed(self._served) or "none"
            raise APIError(
                404,
                f"The LoRA adapter {shown(name)} cannot be found (loaded: {loaded})",
                type="not_found_error",
                param="lora_name",
                code="lora_not_found",
            )
        drained = self._draining[lora.engine_name] = asyncio.Event()
        if not self._running[lora.engine_name]:
            drained.set()
        # the removal goes on if the client leaves: the engine is never left holding an unlisted adapter
        removal = asyncio.ensure_future(self._remove(lora.engine_name, drained))
        self._removals.add(removal)
        removal.add_done_callback(self._removals.discard)
        await asyncio.shield(removal)

    async def _remove(self, engine_name: str, drained: asyncio.Event) -> None:
        try:
            await drained.wait()
            deadline = time.monotonic() + _RELEASE_WAIT_S
            async with self._changes:
                while True:
                    try:
                        return await asyncio.to_thread(self.engine.remove_adapter, engine_name)
                    except RuntimeError:  # a cancelled request the engine has not let go of yet
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.05)
        finally:
            del self._draining[engine_name]


def _listed(names: Iterable[str], most: int = 8) -> str:
    """``names`` quoted for a one-line reply, the first ``most`` of them."""
    names = list(names)
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(shown(n) for n in names[:most]) + more
