"""Does a flights policy's choice of offer depend on the cabin the request asks for?

For every held-out booking episode in an eval file (``RUN/eval/start.jsonl`` after SFT,
``RUN/eval/step_N.jsonl`` after RL), this script replays the episode's own tokens up to the first
offer id the policy wrote (``"offer_id": "OF`` …) and reads the policy's next-token log-probability
of ``1`` against ``2`` there: the first offer of a search is the economy seat of the first flight,
the second its business seat. A policy that reads the request gives economy requests a positive
log-odds and business requests a negative one; a policy that books a fixed position gives both the
same. The policy is loaded as ``--checkpoint`` loads it (a run directory, a ``policy/`` or
``sft_adapter/`` artifact, a checkpoint), in float32.

Prints ``name=value`` lines per cabin (``economy_n``, ``economy_log_odds_of1_of2`` mean, min, max;
the same for ``business``), last ``cabin_effect`` (economy mean minus business mean: ~0 when the
cabin does not move the choice).

    python benchmarks/offer_choice.py POLICY EVAL_JSONL [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from horizonrl.envs.api.flights import heldout_tasks
from horizonrl.models import ModelConfig, load_policy
from horizonrl.train.checkpoint import resolve_policy

OFFER_PREFIX = '"OF'


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


def first_offer_prefix(record: dict, tokenizer) -> list[int] | None:
    """The episode's tokens up to and including the ``"OF`` of the first offer id the policy wrote
    (a token it sampled, not one of an observation), or None when it wrote none."""
    ids = record["prompt_ids"] + record["response_ids"]
    start = len(record["prompt_ids"])
    for i in range(start, len(ids) - 1):
        written = record["loss_mask"][i - start + 1] == 1  # the digit after it is the policy's
        if written and tokenizer.decode(ids[max(start, i - 3) : i + 1]).endswith(OFFER_PREFIX):
            return ids[: i + 1]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", help="a run directory, policy/ or adapter directory")
    parser.add_argument("eval_jsonl", help="the trajectories of a held-out eval of that policy")
    parser.add_argument("--model", default="smollm2-135m", help="the base model (model.path)")
    args = parser.parse_args()

    loaded = load_policy(ModelConfig(path=args.model, dtype="float32"), resolve_policy(Path(args.policy)))
    model, tokenizer = loaded.model().eval(), loaded.tokenizer
    one, two = (tokenizer.convert_tokens_to_ids(d) for d in ("1", "2"))
    cabins = heldout_cabins()
    log_odds: dict[str, list[float]] = {"economy": [], "business": []}
    for line in Path(args.eval_jsonl).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        cabin = cabins.get(record["task_id"])
        prefix = first_offer_prefix(record, tokenizer) if cabin else None
        if prefix is None:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        log_odds[cabin].append(float(logprobs[one] - logprobs[two]))
    means = {}
    for cabin, values in log_odds.items():
        print(f"{cabin}_n={len(values)}")
        if values:
            means[cabin] = statistics.fmean(values)
            print(f"{cabin}_log_odds_of1_of2={means[cabin]:.3f}")
            print(f"{cabin}_log_odds_min={min(values):.2f}")
            print(f"{cabin}_log_odds_max={max(values):.2f}")
    if len(means) == 2:
        print(f"cabin_effect={means['economy'] - means['business']:.3f}")


if __name__ == "__main__":
    main()
