"""memory_pairs: flip face-down cards two at a time to find matching pairs (memory, cumulative reward)."""

from __future__ import annotations

from worldlib import ActionError, Outcome, View, World


class MemoryPairs(World):
    def initial_state(self):
        return {"matched": [], "open": -1}

    def _sym(self, i):
        return "{s" + str(self.level["cards"][i]) + "}"

    def step(self, state, action, args):
        cards = self.level["cards"]
        i = args.get("card")
        if action != "flip" or not isinstance(i, int) or not 0 <= i < len(cards):
            raise ActionError(f"flip takes a card number from 0 to {len(cards) - 1}")
        if i in state["matched"] or i == state["open"]:
            raise ActionError(f"card {i} is already face up")
        j = state["open"]
        if j < 0:
            return Outcome({"matched": state["matched"], "open": i}, event=f"Card {i} shows {self._sym(i)}.")
        if cards[i] == cards[j]:
            matched = sorted(state["matched"] + [i, j])
            done = len(matched) == len(cards)
            event = f"Card {i} shows {self._sym(i)}: a {{match}} with card {j}; both stay face up."
            return Outcome({"matched": matched, "open": -1}, reward=1.0, done=done, event=event)
        event = f"Card {i} shows {self._sym(i)}, card {j} shows {self._sym(j)}: no {{match}}; both face down."
        return Outcome({"matched": state["matched"], "open": -1}, event=event)

    def view(self, state):
        shown = set(state["matched"]) | {state["open"]}
        cards = " ".join(
            f"{i}:{self._sym(i) if i in shown else '?'}" for i in range(len(self.level["cards"]))
        )
        return View(facts={"cards": cards, "pairs found": len(state["matched"]) // 2})

    def max_reward(self):
        return float(len(self.level["cards"]) // 2)

    def oracle(self, state):
        cards, j = self.level["cards"], state["open"]
        if j >= 0:
            return "flip", {"card": next(i for i in range(len(cards)) if i != j and cards[i] == cards[j])}
        return "flip", {"card": next(i for i in range(len(cards)) if i not in state["matched"])}

    @classmethod
    def generate(cls, rng, params):
        pairs = rng.choice(list(params.get("pairs", [3, 4])))
        cards = [s for s in rng.sample(range(int(params.get("symbols", 6))), pairs) for _ in range(2)]
        rng.shuffle(cards)
        return {"cards": cards}


WORLD = MemoryPairs
