"""market: trade one good against a known price schedule to end with the most cash (resource, cumulative)."""

from __future__ import annotations

from worldlib import ActionError, Outcome, View, World


class Market(World):
    def initial_state(self):
        return {"day": 0, "cash": int(self.level["cash"]), "holdings": 0}

    def _trade(self, state, action, qty):
        """(next state, reward) for an action, or an error message for an illegal one."""
        day, cash, hold = int(state["day"]), int(state["cash"]), int(state["holdings"])
        if day >= len(self.level["prices"]):
            return "the market has closed"
        price, cap = int(self.level["prices"][day]), int(self.level["capacity"])
        delta = {"buy": -qty, "sell": qty, "wait": 0}[action] if action in ("buy", "sell", "wait") else None
        if delta is None:
            return f"unknown action {action!r}; valid: buy, sell, wait"
        if action != "wait" and qty < 1:
            return "quantity must be a whole number of at least 1"
        if hold - delta > cap:
            return f"you can hold at most {cap} {{good}}"
        if delta < 0 and cash < price * qty:
            return f"{qty} {{good}} cost {price * qty} {{cash}}; you have {cash}"
        if delta > 0 and hold < qty:
            return f"you hold only {hold} {{good}}"
        reward = price * delta
        return {"day": day + 1, "cash": cash + reward, "holdings": hold - delta}, reward

    def step(self, state, action, args):
        try:
            qty = int(args.get("quantity", 0))
        except (TypeError, ValueError):
            raise ActionError("quantity must be a whole number") from None
        result = self._trade(state, action, qty)
        if isinstance(result, str):
            raise ActionError(result)
        nxt, reward = result
        done = nxt["day"] >= len(self.level["prices"])
        verb = {"buy": "{buying}", "sell": "{selling}"}.get(action)
        event = f"You {verb} {qty} {{good}}." if verb else "A day passes."
        return Outcome(nxt, reward=float(reward), done=done, event=event)

    def view(self, state):
        prices, day = self.level["prices"], int(state["day"])
        facts = {
            "day": f"{min(day + 1, len(prices))} of {len(prices)}",
            "{cash}": state["cash"],
            "{good} held": f"{state['holdings']} (at most {self.level['capacity']})",
            "{price} by day": ", ".join(f"day {i + 1}: {p}" for i, p in enumerate(prices)),
        }
        return View(facts=facts)

    def _best(self, state, memo):
        """The most cash still to gain from ``state`` and the action that gains it."""
        if state["day"] >= len(self.level["prices"]):
            return 0, ("wait", {})
        key = (state["day"], state["cash"], state["holdings"])
        if key not in memo:
            options = []
            for action in ("wait", "buy", "sell"):
                for qty in range(1, int(self.level["capacity"]) + 1) if action != "wait" else [0]:
                    result = self._trade(state, action, qty)
                    if not isinstance(result, str):
                        args = {"quantity": qty} if qty else {}
                        options.append((result[1] + self._best(result[0], memo)[0], (action, args)))
            memo[key] = max(options, key=lambda o: o[0])
        return memo[key]

    def max_reward(self):
        return float(self._best(self.initial_state(), {})[0])

    def oracle(self, state):
        return self._best(state, {})[1]

    @classmethod
    def generate(cls, rng, params):
        lo, hi = params.get("price", [2, 12])
        while True:
            prices = [rng.randint(lo, hi) for _ in range(int(params.get("days", 8)))]
            level = {
                "prices": prices,
                "cash": int(params.get("cash", 20)),
                "capacity": int(params.get("capacity", 5)),
            }
            if cls(level).max_reward() >= 5:
                return level


WORLD = Market
