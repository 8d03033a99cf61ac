"""The engine's decode loop: prefill a batch of prompts, then sample token by token with a KV cache.

The decode loop is our own (not ``model.generate``): prefill computes logits only for the last
position, rows of similar prompt length are prefilled together and their KV caches merged into one
left-padded cache (less padding compute than one call at full width), then decoding proceeds token
by token with the cache. Rows that finish are pruned from the batch and the cache, and requests
that arrive meanwhile join it (continuous batching). Per-row sampling parameters (temperature,
top_p, max_new_tokens, stop strings, seed) may be mixed in one batch: a seeded request samples
from its own generator (reproducible whatever shares its batch); unseeded requests share the
decoder's generator (seeded by ``seed``).

Agent prompts share a long prefix (the system prompt with the tool schemas, and within a GRPO
group the whole task). The decoder keeps the KV cache of the longest prefix every row of the last
batch shared and reuses it for the next batch's shared part, so prefill computes each row's own
suffix only (``stats.prefix_reused_tokens``). The cache is dropped when the weights change.

Multi-turn agents send, turn after turn, a prompt that extends their previous prompt and
completion with a tool observation. When a row finishes, the decoder keeps its KV cache (up to
``prefix_cache_mib`` MiB over all kept rows, least recently stored evicted first); a later
prompt that extends a kept sequence takes that cache and prefills only the new tokens
(``stats.conversation_reused_tokens``). Without it each turn re-prefills the whole conversation,
the largest cost of a multi-turn rollout on a CPU.

Several LoRA adapters may be served at once (``HFEngine.add_adapter``; see
:mod:`horizonrl.engine.adapters`): the model is then a PEFT model and every forward names each row's
adapter (``adapter_names``), so rows of different adapters share a batch. The KV caches kept
between batches belong to one adapter each: a shared prefix is computed and reused only when every
row it serves has that adapter (a mixed batch computes one per adapter), and a conversation is
continued only under its own adapter.
Without adapters no forward names any (the plain model runs as before).

On a CPU the model's decode steps use the attention kernel of :mod:`horizonrl.engine.attention`
(``fast_decode``; 3x faster than ``sdpa`` for a batch with long prompts), and Llama-style models
(plain or the int8 copy) decode with the step written out in :mod:`horizonrl.engine.decode_step`
instead of the model's ``forward``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from horizonrl.engine.adapters import adapter_names
from horizonrl.engine.attention import use_fast_decode
from horizonrl.engine.batch import (
    Batch,
    ConversationCache,
    EngineStats,
    PrefixCache,
    Request,
    Row,
    prefill_groups,
)
from horizonrl.engine.constraints import ConstraintCompiler, mask_logits
from horizonrl.engine.decode_step import decode_step_for
from horizonrl.engine.fast_copy import kv_cache_dtype
from horizonrl.engine.kvcache import (
    cache_kwargs,
    cache_of,
    cast_layers,
    growing,
    make_room,
    mergeable_cache,
    returned_cache,
)
from horizonrl.engine.sampling import sample, top_candidates
from horizonrl.memory import release_free_memory
from horizonrl.tokens import common_prefix_len, eos_token_ids, pad_token_id


def contiguous_head_input(model: Any) -> None:
    """Make the output head's input contiguous before its matmul (idempotent).

    With ``logits_to_keep=1`` transformers applies the head to ``hidden[:, -1:, :]``, a strided view
    of a ``[rows, length, hidden]`` tensor. PyTorch cannot fold that 3-D view into one matrix product,
    so it broadcasts the head's weight to ``[rows, hidden, vocab]`` and copies it: for SmolLM2
    (49,152 x 576, bfloat16) 56 MB per row. Measured on this machine for a 32-row prefill: 1.83 s
    and +1.8 GiB of memory, against 10 ms for the same product on a contiguous copy."""
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return
    if head is None or getattr(head, "_horizonrl_contiguous_input", False):
        return
    head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))
    head._horizonrl_contiguous_input = True


class Decoder:
    """Runs a Hugging Face causal LM over batches of requests (see the module doc). Not thread-safe:
    :class:`horizonrl.engine.hf.HFEngine` drives it from one thread, between weight updates."""

    #: Return freed heap memory to the OS every this many decode steps (KV caches of ever-changing
    #: shapes fragment the heap; measured: without it a continuous batch grew peak memory by 25%
    #: over a 10x longer rollout).
    trim_every_steps: int = 256
    #: Prefill grouping: cost of one extra forward call, in prompt tokens (CPU, small models).
    prefill_overhead_tokens: int = 32
    #: Most padded tokens in one multi-row prefill call (bounds prefill memory).
    max_prefill_tokens: int = 8192
    #: Reuse the KV cache of a prompt prefix shared by every row when it is at least this long
    #: (0 turns prefix caching off).
    min_shared_prefix: int = 32
    #: Decode writes keys and values in place into a buffer this many columns wider than the cache
    #: (one copy per this many tokens instead of one per token; see :mod:`horizonrl.engine.kvcache`).
    kv_grow_tokens: int = 16
    #: Rows that finish or join a batch reuse its KV buffers (see :mod:`horizonrl.engine.kvcache`);
    #: False: each such event copies the cache into fresh buffers, as before (for measuring it).
    reuse_kv_buffers: bool = True
    #: Drop leading KV columns no row attends to any more (their rows finished) once there are this
    #: many: moving the cache costs a copy, keeping them costs attention in every step.
    drop_unattended_columns: int = 64
    #: Decode Llama-style models with the written-out step of :mod:`horizonrl.engine.decode_step`
    #: (the same logits as ``forward`` without transformers' per-step machinery: the engine 1.09-1.11x
    #: faster for SmolLM2-135M); False: through ``forward``.
    written_decode_step: bool = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        seed: int = 0,
        fast_decode: bool = True,
        prefix_cache_mib: float = 384,
    ) -> None:
        if prefix_cache_mib < 0:
            raise ValueError(f"prefix_cache_mib must be >= 0 (0 turns it off), got {prefix_cache_mib}")
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        self.pad_token_id = pad_token_id(tokenizer)
        self.weights_version = 0
        #: rows' KV caches can be merged and split (needed by prefill grouping, the caches kept
        #: between batches and continuous batching)
        self.mergeable_cache = mergeable_cache(model.config)
        self.fast_decode = fast_decode and use_fast_decode(model)
        contiguous_head_input(model)
        #: in-place KV appends need the fast kernel: it takes the mask over the buffer as given
        self._grow_kv = self.fast_decode and self.mergeable_cache
        #: the dtype KV caches are kept in between forward calls (prefill computes in the model's)
        self.kv_dtype = kv_cache_dtype(model) if self._grow_kv else None
        self._generator = torch.Generator().manual_seed(seed)
        self.stats = EngineStats()
        self.prefix: PrefixCache | None = None
        self.conversations = ConversationCache(int(prefix_cache_mib * 2**20) if self.mergeable_cache else 0)
        #: forwards name each row's LoRA adapter (``model`` is a PEFT model holding adapters)
        self.per_row_adapters = False
        self._constraints: ConstraintCompiler | None = None

    @property
    def constraints(self) -> ConstraintCompiler:
        """Compiles requests' constraints into per-row matchers (built on first use, for the
        current end-of-sequence ids: a completed constraint allows only those)."""
        if self._constraints is None or self._constraints.eos_ids != sorted(self.eos_token_ids):
            self._constraints = ConstraintCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._constraints

    def use_model(self, model: Any, per_row_adapters: bool) -> None:
        """Decode with ``model`` from now on: a PEFT model holding LoRA adapters (with
        ``per_row_adapters``, every forward names each row's adapter) or a plain model; drops the KV
        caches."""
        self.model = model
        self.per_row_adapters = per_row_adapters
        self.forget_caches()

    def new_weights(self) -> None:
        """The model's weights changed: KV caches computed before are stale."""
        self.weights_version += 1
        self.forget_caches()

    def forget_caches(self) -> None:
        """Drop the shared-prefix and conversation KV caches."""
        self.prefix = None
        self.conversations.clear()

    def run(
        self,
        requests: list[Request],
        deliver: Callable[[Row], None],
        join: Callable[[int], list[Request]] | None = None,
    ) -> Iterator[int]:
        """Decode ``requests`` token by token, yielding after each step how many rows it delivered;
        ``deliver`` gets each finished row. With ``join`` (called with the batch's row count between
        steps, it returns requests that join the running batch: continuous batching) the newcomers
        are prefilled on their own and their KV cache merged into the batch's; ``requests`` grows by
        them (the caller fails them all if decoding raises)."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield from self._decode(requests, deliver, join)
        finally:
            self.model.train(was_training)
            release_free_memory()  # KV caches of varying shapes would fragment the heap

    def _decode(
        self,
        requests: list[Request],
        deliver: Callable[[Row], None],
        join: Callable[[int], list[Request]] | None,
    ) -> Iterator[int]:
        device = next(self.model.parameters()).device
        # the written-out step appends into the growing KV buffers (read afresh: weights may change)
        use_step = self.written_decode_step and self._grow_kv and not self.per_row_adapters
        step = decode_step_for(self.model) if use_step else None
        batch = self._start([Row.of(r, self.weights_version) for r in requests], device)
        while True:
            delivered = self._retire(batch, deliver)
            joined = join(len(batch.rows)) if join is not None else []
            if joined:
                requests.extend(joined)
                newcomers = self._start(  # merged into the batch's buffers at once: no own to grow
                    [Row.of(r, self.weights_version) for r in joined], device, grow=not batch.rows
                )
                delivered += self._retire(newcomers, deliver)
                grow_by = self.kv_grow_tokens if self._grow_kv else 0
                batch = batch.extend(newcomers, self.model.config, grow_by, self.reuse_kv_buffers)
            if not batch.rows:
                return
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones((batch.mask.shape[0], 1))], dim=-1)
            if step is not None:
                logits = step(batch.tokens, batch.next_pos, batch.cache, self._decode_mask(batch))
            else:
                out = self.model(
                    input_ids=batch.tokens[:, None],
                    attention_mask=self._decode_mask(batch),
                    position_ids=batch.next_pos[:, None],
                    **cache_kwargs(self.model, batch.cache),
                    **self._adapters([row.adapter for row in batch.rows]),
                    use_cache=True,
                )
                batch.cache, logits = returned_cache(out), out.logits[:, -1, :]
            batch.next_pos = batch.next_pos + 1
            batch.tokens = self._step_rows(batch.rows, logits, batch.temps, batch.top_ps)
            self.stats.decode_steps += 1
            self.stats.decode_rows += len(batch.rows)
            if self.stats.decode_steps % self.trim_every_steps == 0:
                release_free_memory()  # a continuous batch can run for minutes: keep the heap compact
            yield delivered

    def _adapters(self, adapters: Sequence[str | None]) -> dict[str, Any]:
        """The forward keyword selecting each row's adapter (none without adapters: no overhead)."""
        return {"adapter_names": adapter_names(adapters)} if self.per_row_adapters else {}

    @property
    def _compute_dtype(self) -> torch.dtype:
        """The dtype the model computes keys and values in (a past handed to ``forward`` is cast to it)."""
        return self.model.get_input_embeddings().weight.dtype

    @property
    def _kept_dtype(self) -> torch.dtype:
        """The dtype the caches a forward returned are kept in: ``kv_dtype``, else the model's own."""
        return self.kv_dtype or self._compute_dtype

    # ----------------------------------------------------------------------------- prefill
    def _shared_prefix(
        self, prompts: list[list[int]], adapter: str | None, device: torch.device
    ) -> PrefixCache | None:
        """The KV cache under ``adapter`` of the longest prefix all ``prompts`` share (each keeps >= 1
        own token), reused from the previous batch where it matches (same adapter too) and extended by
        one forward call where the batch shares more; None when the shared part is too short to
        bother."""
        if not self.mergeable_cache or self.min_shared_prefix <= 0:
            return None
        common = common_prefix_len(prompts, min(len(p) for p in prompts) - 1)
        if common < self.min_shared_prefix:
            return None
        cached = self.prefix
        if cached is not None and (cached.weights_version, cached.adapter) != (self.weights_version, adapter):
            cached = None
        reuse = common_prefix_len([cached.ids, prompts[0]], common) if cached else 0
        if reuse < self.min_shared_prefix:
            reuse, cached = 0, None
        layers = [(k[:, :, :reuse], v[:, :, :reuse]) for k, v in cached.layers] if cached else []
        if common > reuse:  # compute the rest of the shared prefix for one row
            compute = self._compute_dtype
            layers = [(k.to(compute), v.to(compute)) for k, v in layers]
            past = DynamicCache(ddp_cache_data=layers, config=self.model.config) if layers else None
            ids = torch.tensor([prompts[0][reuse:common]], dtype=torch.long, device=device)
            out = self.model(
                input_ids=ids,
                attention_mask=torch.ones((1, common), dtype=torch.long, device=device),
                position_ids=torch.arange(reuse, common, device=device)[None],
                **cache_kwargs(self.model, past),
                **self._adapters([adapter]),
                use_cache=True,
                logits_to_keep=1,
            )
            kept = self._kept_dtype
            layers = [(keys.to(kept), values.to(kept)) for keys, values, *_ in returned_cache(out)]
        self.prefix = PrefixCache(list(prompts[0][:common]), layers, self.weights_version, adapter)
        self.stats.prefix_reused_tokens += reuse + common * (len(prompts) - 1)
        return self.prefix

    def _prefill(
        self, prompts: list[list[int]], adapters: list[str | None], device: torch.device
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Run the prompts through the model, each under its adapter (None: the base model); return
        (KV cache, last-position logits, attention mask).

        Each row starts from a cached past where one exists: its own earlier turn (from the
        conversation cache) or the prefix the other rows of its adapter share (:meth:`_shared_prefix`,
        one per adapter in a mixed batch), a past computed under the row's adapter in both cases; only
        the rest of the prompt, its suffix, is computed. Prefill is compute-bound, so rather than
        pushing every row through at full width, rows are prefilled in groups of similar suffix
        length (see :func:`horizonrl.engine.batch.prefill_groups`). A group's cache is laid out as
        ``[padding | past | padding | suffix]`` per row (one group: that is the batch's cache, padded
        slots masked out); several groups' caches are merged, right-aligned and without the inner
        padding.
        """
        pasts: list[PrefixCache | None] = [None] * len(prompts)
        if self.mergeable_cache and self.conversations.max_bytes:
            for i, prompt in enumerate(prompts):
                pasts[i] = self.conversations.take(prompt, adapters[i])
                if pasts[i] is not None:
                    self.stats.conversation_reused_tokens += len(pasts[i].ids)
        by_adapter: dict[str | None, list[int]] = {}
        for i, past in enumerate(pasts):
            if past is None:
                by_adapter.setdefault(adapters[i], []).append(i)
        for adapter, rows in by_adapter.items():  # keys and values of one adapter serve only its rows
            if len(rows) > 1 or len(by_adapter) == 1:  # (a lone row of a mixed batch: its whole prompt)
                prefix = self._shared_prefix([prompts[i] for i in rows], adapter, device)
                for i in rows:
                    pasts[i] = prefix
        cached = [len(p.ids) if p is not None else 0 for p in pasts]
        suffixes = [p[c:] for p, c in zip(prompts, cached, strict=True)]
        lengths = [len(p) for p in suffixes]
        width = max(c + n for c, n in zip(cached, lengths, strict=True))
        groups = (
            prefill_groups(lengths, self.prefill_overhead_tokens, self.max_prefill_tokens)
            if self.mergeable_cache
            else []
        )
        if len(groups) <= 1:  # one call over the whole batch, rows in request order
            groups = [list(range(len(prompts)))]
        logits = torch.empty((len(prompts), self.vocab_size), device=device)
        merged: list[tuple[torch.Tensor, torch.Tensor]] = []
        # a past is handed to forward in the model's dtype; caches are kept in theirs
        compute, kept = self._compute_dtype, self._kept_dtype
        for group in groups:
            g_width = max(lengths[i] for i in group)
            g_past = max(cached[i] for i in group)
            rows = len(group)
            ids = torch.full((rows, g_width), self.pad_token_id, dtype=torch.long)
            g_mask = torch.zeros((rows, g_past + g_width), dtype=torch.long)
            positions = torch.zeros((rows, g_width), dtype=torch.long)
            for j, i in enumerate(group):  # left padding: each row's last token is in the last column
                n, c = lengths[i], cached[i]
                ids[j, g_width - n :] = torch.tensor(suffixes[i], dtype=torch.long)
                g_mask[j, g_past - c : g_past] = 1
                g_mask[j, g_past + g_width - n :] = 1
                positions[j, g_width - n :] = torch.arange(c, c + n)
            past = None
            if g_past:
                layers = []
                for layer, (k0, v0) in enumerate(next(pasts[i] for i in group if pasts[i]).layers):
                    shape = (rows, k0.shape[1], g_past, k0.shape[-1])
                    keys, values = k0.new_zeros(shape, dtype=compute), v0.new_zeros(shape, dtype=compute)
                    for j, i in enumerate(group):
                        if pasts[i] is not None:
                            k, v = pasts[i].layers[layer]
                            keys[j, :, g_past - cached[i] :] = k[0, :, : cached[i]]
                            values[j, :, g_past - cached[i] :] = v[0, :, : cached[i]]
                    layers.append((keys, values))
                past = cache_of(layers, self.model.config)
                del layers, keys, values
            out = self.model(
                input_ids=ids.to(device),
                attention_mask=g_mask.to(device),
                position_ids=positions.to(device),
                **cache_kwargs(self.model, past),
                **self._adapters([adapters[i] for i in group]),
                use_cache=True,
                logits_to_keep=1,
            )
            if len(groups) == 1:  # padded slots stay in place, masked out (no merge copy)
                return returned_cache(out), out.logits[:, -1, :], g_mask.to(device)
            index = torch.tensor(group, dtype=torch.long, device=device)
            logits[index] = out.logits[:, -1, :].to(logits.dtype)
            for layer, (keys, values, *_) in enumerate(returned_cache(out)):
                if len(merged) <= layer:
                    shape = (len(prompts), keys.shape[1], width, keys.shape[-1])
                    merged.append((keys.new_zeros(shape, dtype=kept), values.new_zeros(shape, dtype=kept)))
                m_keys, m_values = merged[layer]
                for j, i in enumerate(group):  # [past | suffix], right-aligned, inner padding dropped
                    c, n = cached[i], lengths[i]
                    start = width - c - n
                    if c:
                        m_keys[i, :, start : start + c] = keys[j, :, g_past - c : g_past]
                        m_values[i, :, start : start + c] = values[j, :, g_past - c : g_past]
                    m_keys[i, :, width - n :] = keys[j, :, g_past + g_width - n :]
                    m_values[i, :, width - n :] = values[j, :, g_past + g_width - n :]
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for i, (c, n) in enumerate(zip(cached, lengths, strict=True)):
            mask[i, width - c - n :] = 1
        return DynamicCache(ddp_cache_data=merged, config=self.model.config), logits, mask

    # ----------------------------------------------------------------------------- decode steps
    def _decode_mask(self, batch: Batch) -> torch.Tensor:
        """The attention mask of a decode step. The fast kernel takes it as a ready 4-D mask (so
        transformers skips building a causal mask every step: measured 6% of a tiny model's decode
        time), over the whole KV buffer when keys and values are appended in place."""
        if not self.fast_decode:
            return batch.mask
        mask = batch.mask
        capacity = make_room(batch.cache, 1) if self._grow_kv else None
        if capacity is not None and capacity > mask.shape[1]:
            mask = torch.nn.functional.pad(mask, (0, capacity - mask.shape[1]))
        return mask[:, None, None, :].bool()

    def _start(self, rows: list[Row], device: torch.device, grow: bool = True) -> Batch:
        """Prefill ``rows`` and sample their first token: a batch ready to decode (``grow=False``:
        its cache left plain, in the dtype caches are kept in, for rows that join a running batch)."""
        cache, logits, mask = self._prefill([r.prompt for r in rows], [r.adapter for r in rows], device)
        temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32, device=device)
        top_ps = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=device)
        next_pos = torch.tensor([len(r.prompt) for r in rows], dtype=torch.long, device=device)
        tokens = self._step_rows(rows, logits, temps, top_ps)
        if self._grow_kv:  # decode appends in place instead of copying the cache per token
            cache = (
                growing(cache, self.kv_grow_tokens, self.kv_dtype)
                if grow
                else cast_layers(cache, self.kv_dtype)
            )
        return Batch(rows, cache, mask, next_pos, tokens, temps, top_ps)

    def _retire(self, batch: Batch, deliver: Callable[[Row], None]) -> int:
        """Deliver the rows that just finished, keep their KV cache for the conversation's next
        turn, and drop them from the batch; returns how many."""
        done = [j for j, row in enumerate(batch.rows) if row.finish is not None]
        if not done:
            return 0
        for j in done:
            deliver(batch.rows[j])
        self.conversations.keep(
            batch.cache, batch.mask, [batch.rows[j] for j in done], done, self.weights_version
        )
        reuse = self.reuse_kv_buffers
        drop_at = self.drop_unattended_columns if self._grow_kv and reuse else 0
        batch.select([j for j, row in enumerate(batch.rows) if row.finish is None], drop_at, reuse)
        return len(done)

    def _step_rows(
        self, rows: list[Row], logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor
    ) -> torch.Tensor:
        """Sample each row's next token from ``logits`` and record it; rows whose caller gave up
        (a cancelled future, e.g. a timed-out episode) are finished without delivery.

        A constrained row samples from the tokens its matcher allows (the others' logits are
        ``-inf``), so its logprob and top candidates are under that masked distribution; the matcher
        then consumes the token."""
        constrained = [j for j, row in enumerate(rows) if row.matcher is not None]
        if constrained:
            logits = mask_logits(logits, constrained, [rows[j].matcher for j in constrained])
        tokens, logprobs = sample(logits, temps, top_ps, [r.generator for r in rows], self._generator)
        wanted = [j for j, row in enumerate(rows) if row.top_logprobs is not None]
        if wanted:
            for j, top in zip(wanted, top_candidates(logits, temps, wanted, rows), strict=True):
                rows[j].top_logprobs.append(top)  # type: ignore[union-attr]
        for row, tok, lp in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            if row.matcher is not None and not row.matcher.consume_token(tok):
                row.finish = "stop"  # never expected under the mask: end the row, constraint_met False
            self._append(row, tok, lp)
            if row.finish is None and row.request is not None and row.request.abandoned:
                row.finish = "length"
        self.stats.generated_tokens += len(rows)
        return tokens

    def _append(self, row: Row, token: int, logprob: float) -> None:
        """Record a sampled token and decide whether the row is finished."""
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if row.request is not None and row.request.on_token is not None:
            row.request.on_token(token, logprob)
        if row.finish is not None:
            return
        if token in self.eos_token_ids or (
            row.params.stop and self._hits_stop(row.token_ids, row.params.stop)
        ):
            row.finish = "stop"
        elif len(row.token_ids) >= row.params.max_new_tokens:
            row.finish = "length"

    def _hits_stop(self, token_ids: list[int], stops: tuple[str, ...]) -> bool:
        """Whether the recent generated text contains a stop string (decoding only a short tail).

        A stop string completed earlier would have ended the row then, so any hit here was
        completed by the newest token. The tail holds one token per stop-string character plus
        slack, which covers the string since tokens decode to at least one character.
        """
        window = max(len(s) for s in stops) + 4
        text = self.tokenizer.decode(token_ids[-window:], skip_special_tokens=False)
        return any(s in text for s in stops)
