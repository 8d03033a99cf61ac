"""Does a flights policy's choice of offer depend on the cabin the request asks for?

For every held-out booking episode in an eval file (``RUN/eval/start.jsonl`` after SFT,
``RUN/eval/step_N.jsonl`` after RL), this script replays the episode's own tokens up to the point
where the policy chose between the cabins and reads its next-token log-odds of economy over business
there. That point is the first of:

- an offer id the policy wrote (``"offer_id": "OF`` …): ``1`` against ``2`` — the first offer of a
  search is the economy seat of the first flight, the second its business seat;
- a quoted search record (``{"cabin": "`` …, what a policy trained on demonstrations that quote their
  source writes before the call, ``flights`` option ``quote_sources``): the first token of
  ``economy`` against ``business``; the offer id then follows by copying.

A policy that reads the request gives economy requests a positive log-odds and business requests a
negative one; a policy that books a fixed position gives both the same. The policy is loaded as
``--checkpoint`` loads it (a run directory, a ``policy/`` or ``sft_adapter/`` artifact, a
checkpoint), in float32.

Prints ``name=value`` lines per cabin (``economy_n``, ``economy_log_odds`` mean, min, max, and
``economy_at_quote``: how many of them decided at a quote; the same for ``business``), last
``cabin_effect`` (economy mean minus business mean: ~0 when the cabin does not move the choice).

    python benchmarks/offer_choice.py POLICY EVAL_JSONL [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from horizonrl.envs.api.flights import heldout_tasks
from horizonrl.model_config import ModelConfig
from horizonrl.models import load_policy
from horizonrl.train.checkpoint import resolve_policy

OFFER_PREFIX = '"OF'
CABIN_PREFIX = '"cabin": "'


CABINS = ("economy", "business")


def heldout_cabins() -> dict[str, str]:
    """Held-out booking task id -> the one cabin its request names (every held-out booking names
    one: ``economy please``, ``a business class ticket``); tasks naming none or both are left out."""
    cabins = {}
    for task in heldout_tasks():
        booked = any(call["name"] == "book_ticket" for call in task.data["reference_solution"])
        named = [cabin for cabin in CABINS if cabin in task.data["query"].lower()]
        if booked and len(named) == 1:
            cabins[task.id] = named[0]
    return cabins


def choice_prefix(record: dict, tokenizer) -> tuple[list[int], str] | None:
    """The episode's tokens up to the policy's first choice between the cabins — through the ``"OF``
    of an offer id or the ``"cabin": "`` of a quoted record, whichever it wrote first (the next
    token is its own, not one of an observation) — and which of the two it was; None when neither."""
    ids = record["prompt_ids"] + record["response_ids"]
    start = len(record["prompt_ids"])
    for i in range(start, len(ids) - 1):
        if record["loss_mask"][i - start + 1] != 1:
            continue
        text = tokenizer.decode(ids[max(start, i - 6) : i + 1])
        if text.endswith(OFFER_PREFIX):
            return ids[: i + 1], "offer_id"
        if text.endswith(CABIN_PREFIX):
            return ids[: i + 1], "quote"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", help="a run directory, policy/ or adapter directory")
    parser.add_argument("eval_jsonl", help="the trajectories of a held-out eval of that policy")
    parser.add_argument("--model", default="smollm2-135m", help="the base model (model.path)")
    args = parser.parse_args()

    loaded = load_policy(ModelConfig(path=args.model, dtype="float32"), resolve_policy(Path(args.policy)))
    model, tokenizer = loaded.model().eval(), loaded.tokenizer
    # the economy and business token at each kind of choice: the offer's digit, the cabin's first token
    options = {
        "offer_id": [tokenizer.convert_tokens_to_ids(d) for d in ("1", "2")],
        "quote": [tokenizer.encode(word, add_special_tokens=False)[0] for word in CABINS],
    }
    cabins = heldout_cabins()
    log_odds: dict[str, list[float]] = {"economy": [], "business": []}
    at_quote = dict.fromkeys(CABINS, 0)
    for line in Path(args.eval_jsonl).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        cabin = cabins.get(record["task_id"])
        found = choice_prefix(record, tokenizer) if cabin else None
        if found is None:
            continue
        prefix, kind = found
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        economy, business = options[kind]
        log_odds[cabin].append(float(logprobs[economy] - logprobs[business]))
        at_quote[cabin] += kind == "quote"
    means = {}
    for cabin, values in log_odds.items():
        print(f"{cabin}_n={len(values)}")
        print(f"{cabin}_at_quote={at_quote[cabin]}")
        if values:
            means[cabin] = statistics.fmean(values)
            print(f"{cabin}_log_odds={means[cabin]:.3f}")
            print(f"{cabin}_log_odds_min={min(values):.2f}")
            print(f"{cabin}_log_odds_max={max(values):.2f}")
    if len(means) == 2:
        print(f"cabin_effect={means['economy'] - means['business']:.3f}")


if __name__ == "__main__":
    main()
