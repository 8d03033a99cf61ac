"""One data-parallel trainer rank for tests/test_distributed_train.py, run as its own process:

    python tests/dp_rank.py RANK WORLD PORT OUT CONFIG_JSON

Builds the tiny random model with the same LoRA adapters (and value head) as the test, joins a gloo
process group on 127.0.0.1:PORT, runs one ``train_step`` on its share of the shared batch and saves
the trained weights and the step's metrics to OUT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dp_case import build, run_step

from horizonrl.data_parallel import TorchCollective


def main() -> None:
    rank, world, port, out, config = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        sys.argv[5],
    )
    torch.set_num_threads(1)
    collective = TorchCollective("127.0.0.1", port, rank, world, "gloo", timeout_s=120)
    model, head, optimizer, scheduler, cfg = build(json.loads(config))
    metrics = run_step(model, head, optimizer, scheduler, cfg, collective)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    if head is not None:
        trained.update({f"head.{n}": p.detach().clone() for n, p in head.named_parameters()})
    torch.save({"weights": trained, "metrics": metrics}, out)
    collective.close()


if __name__ == "__main__":
    main()
