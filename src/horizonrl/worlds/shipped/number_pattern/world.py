"""number_pattern: name the next number of each of five integer sequences (pattern, cumulative reward)."""

from __future__ import annotations

from worldlib import ActionError, Outcome, View, World

RULES = ("arithmetic", "geometric", "alternating", "squares", "fibonacci")


def sequence(rng, rule, n):
    if rule == "arithmetic":
        a, d = rng.randint(1, 20), rng.randint(2, 9)
        return [a + d * i for i in range(n)]
    if rule == "geometric":
        a, q = rng.randint(1, 5), rng.choice([2, 3])
        return [a * q**i for i in range(n)]
    if rule == "alternating":
        a, p, q = rng.randint(1, 20), *rng.sample(range(1, 10), 2)
        out = [a]
        for i in range(n - 1):
            out.append(out[-1] + (p if i % 2 == 0 else q))
        return out
    if rule == "squares":
        k, c = rng.randint(1, 4), rng.randint(0, 9)
        return [(k + i) ** 2 + c for i in range(n)]
    out = [rng.randint(1, 9), rng.randint(1, 9)]
    while len(out) < n:
        out.append(out[-1] + out[-2])
    return out


class NumberPattern(World):
    def initial_state(self):
        return {"round": 0, "score": 0}

    def step(self, state, action, args):
        value, rounds = args.get("value"), self.level["rounds"]
        if action != "answer" or not isinstance(value, int) or isinstance(value, bool):
            raise ActionError("answer takes an integer value")
        r, right = state["round"], value == self.level["rounds"][state["round"]][-1]
        state = {"round": r + 1, "score": state["score"] + int(right)}
        event = f"Round {r + 1}: {value} is {{right}}." if right else f"Round {r + 1}: {value} is {{wrong}}."
        return Outcome(state, reward=float(right), done=r + 1 == len(rounds), event=event)

    def view(self, state):
        rounds, r = self.level["rounds"], state["round"]
        facts = {"round": f"{min(r + 1, len(rounds))} of {len(rounds)}", "score": state["score"]}
        if r < len(rounds):
            facts["sequence"] = ", ".join(str(v) for v in rounds[r][:-1]) + ", ?"
        return View(facts=facts)

    def max_reward(self):
        return float(len(self.level["rounds"]))

    def oracle(self, state):
        return "answer", {
            "value": self.level["rounds"][min(state["round"], len(self.level["rounds"]) - 1)][-1]
        }

    @classmethod
    def generate(cls, rng, params):
        n, k = int(params.get("length", 5)), int(params.get("rounds", 5))
        return {"rounds": [sequence(rng, rng.choice(RULES), n + 1) for _ in range(k)]}


WORLD = NumberPattern
