"""`horizon learn`: methods (selection x optimization x target) run for K iterations per env, every
candidate kept, the environment-adaptive choice and the learning upper bound reported.

Layout of the run directory::

    config.yaml                    the resolved recipe (a resumed run must match it)
    learn.json                     the summary, rewritten after every iteration
    learn/ENV/candidates/ID/       every candidate of ENV (see horizonrl.learn.candidate)
    learn/ENV/METHOD/iterations.jsonl
                                   one line per finished iteration: parent, child, why unchanged, costs
    learn/ENV/METHOD/iter_NNN/     an iteration's optimizer reply, or its training run (model methods)

One iteration of a method: select a parent among the method's candidates (its lineage, which starts
at the env's baseline candidate), ask its optimizer for a new version of its target component,
measure the child (training levels, then validation levels). A method's score after i iterations is
the validation reward of the candidate its selection would keep (the best training reward) among
the candidates it has made so far. Everything is written before it counts, so a run stopped at any
point resumes (``--resume``) at the iteration it was in, and the optimizer's sampling is seeded per
(env, method, iteration) so a repeated iteration asks the same question.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horizonrl.config import RunConfig
from horizonrl.errors import CheckpointError, ConfigError
from horizonrl.io import write_text_atomic
from horizonrl.learn.candidate import Candidate, CandidateStore, Components
from horizonrl.learn.config import LearnConfig, LearnEnv
from horizonrl.learn.evaluate import Evaluator
from horizonrl.learn.lineage import Iteration, Lineage
from horizonrl.learn.methods import Method, parse_method
from horizonrl.learn.select import select, select_best
from horizonrl.seeds import derive_seed

#: sections a resumed learn run must share with the run it continues
RESUME_SECTIONS = ("seed", "model", "agent", "sampling", "eval", "learn", "roles")


def learn_envs(config: RunConfig) -> list[LearnEnv]:
    envs = config.learn.envs or [LearnEnv(name=config.env.name, options=dict(config.env.options))]
    titles = [e.title() for e in envs]
    twice = sorted({t for t in titles if titles.count(t) > 1})
    if twice:
        raise ConfigError(
            f"learn.envs: {', '.join(twice)} appear twice; give them distinct labels (label: ...)"
        )
    return envs


class LearnRun:
    """One `horizon learn` invocation over a run directory."""

    def __init__(
        self,
        config: RunConfig,
        say: Callable[[str], None] | None = None,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:
        if resume and overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces it: pass one of them")
        self.config = config
        self.learn: LearnConfig = config.learn
        self.say = say or (lambda text: None)
        self.resume = resume
        self.overwrite = overwrite
        self.run_dir = config.run_dir
        self.envs = learn_envs(config)
        self.methods = [parse_method(m) for m in self.learn.methods]
        self.evaluator = Evaluator(config, self.learn, self.run_dir)
        self._stores: dict[str, CandidateStore] = {}
        self._lineages: dict[tuple[str, str], Lineage] = {}
        self._start = time.perf_counter()
        self._bandit: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ the run directory
    def _claim(self) -> None:
        from horizonrl.train.rundir import check_same_recipe, claim_run_dir

        learn_dir = self.run_dir / "learn"
        if self.resume:
            if not learn_dir.is_dir():
                raise CheckpointError(f"--resume: {str(learn_dir)!r} does not exist; nothing to resume")
            check_same_recipe(self.run_dir, self.config, RESUME_SECTIONS)
            return
        if learn_dir.exists() and not self.overwrite:
            raise ConfigError(
                f"run directory {str(self.run_dir)!r} already holds a learn run: pass --resume to continue "
                "it, --overwrite to move it to output_dir/.trash and start afresh, or choose another name "
                "(name=...)"
            )
        moved = claim_run_dir(self.run_dir, self.config, self.overwrite)
        if moved is not None:
            self.say(f"--overwrite: moved the old run to {moved}")

    def env_dir(self, env: LearnEnv) -> Path:
        return self.run_dir / "learn" / env.title()

    def store(self, env: LearnEnv) -> CandidateStore:
        key = env.title()
        if key not in self._stores:
            self._stores[key] = CandidateStore(self.env_dir(env))
            self._stores[key].remove_partial()
        return self._stores[key]

    def lineage(self, env: LearnEnv, method: Method) -> Lineage:
        """``method``'s lineage on ``env`` (whose baseline must have been measured: :meth:`root`)."""
        key = (env.title(), method.name)
        if key not in self._lineages:
            root = self.store(env).find(Components())
            if root is None:
                raise RuntimeError(f"{env.title()}: the baseline is not measured yet")
            self._lineages[key] = Lineage(self.env_dir(env) / method.slug, root.id)
        return self._lineages[key]

    def started(self, env: LearnEnv) -> bool:
        """Whether ``env``'s baseline has been measured (its methods can have iterations)."""
        return self.store(env).find(Components()) is not None

    # ------------------------------------------------------------------ candidates
    def root(self, env: LearnEnv) -> Candidate:
        """The env's baseline candidate (the recipe's agent as it is), measured once for every method."""
        store = self.store(env)
        found = store.find(Components())
        if found is not None:
            return found
        self.say(f"{env.title()}: measuring the baseline")
        metrics, train, val = self.evaluator.measure(Components(), env)
        cand = Candidate(id=store.next_id(), env=env.title(), components=Components(), metrics=metrics)
        store.add(cand, train, val)
        self.say(
            f"{env.title()}: baseline val reward {metrics.val_reward:.3f} "
            f"(success {metrics.val_success:.0%} [95% {metrics.val_success_low:.0%}, "
            f"{metrics.val_success_high:.0%}]) · train reward {metrics.train_reward:.3f}"
        )
        return cand

    def _new_candidate(
        self,
        env: LearnEnv,
        method: Method,
        parent: Candidate,
        i: int,
        components: Components,
        measure_as: Components | None = None,
        extra: Any = None,
        cand_id: str | None = None,
    ) -> tuple[Candidate, bool, int]:
        """The candidate holding ``components`` (measured and stored when new): (it, whether new, tokens)."""
        store = self.store(env)
        found = store.find(components)
        if found is not None:
            return found, False, 0
        metrics, train, val = self.evaluator.measure(measure_as or components, env)
        cand = Candidate(
            id=cand_id or store.next_id(),
            env=env.title(),
            components=components,
            parent=parent.id,
            method=method.name,
            iteration=i,
            metrics=metrics,
        )
        store.add(cand, train, val, extra=extra)
        return cand, True, metrics.eval_tokens

    def _plan(self, env: LearnEnv, method: Method) -> tuple[int, Candidate, Path]:
        """The next iteration's number, its parent (by the method's selection) and its folder."""
        lineage = self.lineage(env, method)
        i = len(lineage.records) + 1
        rng = random.Random(derive_seed(self.config.seed, "learn-select", env.title(), method.name, i))
        store = self.store(env)
        parent = select(method.selection, [store.get(c) for c in lineage.members()], rng)
        return i, parent, lineage.folder / f"iter_{i:03d}"

    def _record(self, env: LearnEnv, method: Method, rec: Iteration) -> None:
        self.lineage(env, method).append(rec)
        child = self.store(env).get(rec.child) if rec.child else None
        what = (
            f"-> {child.id} val {child.metrics.val_reward:.3f} train {child.metrics.train_reward:.3f}"
            + ("" if rec.new else " (an existing candidate)")
            if child is not None
            else f"unchanged ({rec.reason})"
        )
        self.say(
            f"{env.title()} · {method.name} · iteration {rec.iteration}: parent {rec.parent} {what} · "
            f"{rec.wall_s:.0f} s"
        )

    def advance(self, env: LearnEnv, methods: list[Method]) -> None:
        """The next iteration of each of ``methods`` on ``env``. The optimizer role's requests of
        all prompt and agent-code methods go out together (the engine decodes them as one batch),
        then each child is measured; model methods train one after another."""
        text = [m for m in methods if m.target != "model"]
        if text:
            self._advance_text(env, text)
        for method in methods:
            if method.target == "model":
                i, parent, work = self._plan(env, method)
                start = time.perf_counter()
                rec = self._advance_model(env, method, parent, i, work)
                rec.wall_s = time.perf_counter() - start
                self._record(env, method, rec)
                self.write_summary()

    def _advance_text(self, env: LearnEnv, methods: list[Method]) -> None:
        from horizonrl.learn.optimize import propose
        from horizonrl.roles import Roles

        plans = [self._plan(env, m) for m in methods]
        store = self.store(env)
        # the optimizer role's 'policy' backend is the recipe's own model
        runtime = self.evaluator.runtime(Components())
        tokenizer = runtime.tokenizer
        client = Roles(self.config.roles, runtime.engine, tokenizer).get("optimizer")

        def count(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

        budget = runtime.agent.token_budget
        limit = min(self.learn.max_prompt_tokens, max(budget - 4 * self.config.sampling.max_new_tokens, 1))

        async def ask_all() -> list[Any]:
            return await asyncio.gather(
                *(
                    propose(
                        client,
                        m.optimization,
                        m.target,
                        parent.components,
                        store.trajectories(parent.id, "train"),
                        k=self.learn.recent_trajectories,
                        step_chars=self.learn.step_chars,
                        count_tokens=count,
                        max_prompt_tokens=limit,
                        sampling={
                            "temperature": self.learn.optimizer_temperature,
                            "max_tokens": self.learn.optimizer_max_tokens,
                            "seed": derive_seed(self.config.seed, "learn-optimize", env.title(), m.name, i),
                        },
                    )
                    for m, (i, parent, _) in zip(methods, plans, strict=True)
                )
            )

        start = time.perf_counter()
        proposals = asyncio.run(ask_all())
        shared = (time.perf_counter() - start) / len(methods)  # the batch's time, split evenly
        for m, (i, parent, work), proposal in zip(methods, plans, proposals, strict=True):
            start = time.perf_counter()
            work.mkdir(parents=True, exist_ok=True)
            write_text_atomic(work / "optimizer_reply.txt", proposal.reply)
            tokens = proposal.stats.get("request_chars", 0) // 4 + count(proposal.reply)
            rec = Iteration(iteration=i, parent=parent.id, reason=proposal.reason, optimizer_tokens=tokens)
            if proposal.components is not None:
                child, new, eval_tokens = self._new_candidate(env, m, parent, i, proposal.components)
                rec = rec.model_copy(update={"child": child.id, "new": new, "eval_tokens": eval_tokens})
            rec.wall_s = shared + time.perf_counter() - start
            self._record(env, m, rec)
            self.write_summary()

    def _advance_model(
        self, env: LearnEnv, method: Method, parent: Candidate, i: int, work: Path
    ) -> Iteration:
        from horizonrl.learn.model_opt import merge_into, train_model

        store = self.store(env)
        parent_model = self.evaluator.model_path(parent.components)
        self.evaluator.close()  # the training run loads its own copy
        policy, why, summary = train_model(
            self.config,
            self.learn,
            env,
            method.optimization,
            parent_model,
            store.trajectories(parent.id, "train"),
            work,
            derive_seed(self.config.seed, "learn-train", env.title(), method.name, i),
        )
        if policy is None:
            return Iteration(iteration=i, parent=parent.id, reason=why)
        staged = work / "model"
        shutil.rmtree(staged, ignore_errors=True)
        merge_into(policy, parent_model, self.config.model.dtype, staged)
        shutil.rmtree(work / "train" / "checkpoints", ignore_errors=True)  # the merged weights are the result
        cand_id = store.next_id()
        final = Components(
            prompt=parent.components.prompt,
            agent_code=parent.components.agent_code,
            model=str((store.folder(cand_id) / "model").relative_to(self.run_dir)),
        )
        measure_as = final.model_copy(update={"model": str(staged.relative_to(self.run_dir))})

        def move_model(tmp: Path) -> None:
            shutil.move(str(staged), str(tmp / "model"))

        child, new, eval_tokens = self._new_candidate(
            env, method, parent, i, final, measure_as=measure_as, extra=move_model, cand_id=cand_id
        )
        tokens = int(summary.get("generated_tokens", 0) or 0)
        return Iteration(
            iteration=i,
            parent=parent.id,
            child=child.id,
            new=new,
            optimizer_tokens=tokens,
            eval_tokens=eval_tokens,
        )

    # ------------------------------------------------------------------ scores
    def kept(self, env: LearnEnv, method: Method, iterations: int) -> Candidate:
        """The candidate ``method`` keeps after ``iterations`` iterations (the best training reward)."""
        store = self.store(env)
        return select_best([store.get(c) for c in self.lineage(env, method).members(iterations)])

    def score(self, env: LearnEnv, method: Method, iterations: int) -> float:
        """Validation reward of the candidate ``method`` keeps after ``iterations`` iterations."""
        return self.kept(env, method, iterations).metrics.val_reward

    def ensure(self, env: LearnEnv, methods: list[Method], iterations: int) -> None:
        """Iterate ``methods`` on ``env`` until each has run ``iterations`` iterations."""
        while True:
            behind = [m for m in methods if len(self.lineage(env, m).records) < iterations]
            if not behind:
                return
            self.advance(env, behind)

    def bandit(self, env: LearnEnv) -> dict[str, Any]:
        """UCB1 over the methods: each gets ``probe_iterations``, then the budget left (the even
        split's, ``len(methods) x iterations``) goes one iteration at a time to the method with the
        highest validation score plus ``bandit_c * sqrt(ln t / n)``."""
        probe = self.learn.probe_iterations
        pulls = {m.name: probe for m in self.methods}
        budget = len(self.methods) * self.learn.iterations
        self.ensure(env, self.methods, probe)
        while sum(pulls.values()) < budget:
            log_t = math.log(sum(pulls.values()))

            def ucb(m: Method, log_t: float = log_t) -> float:
                n = pulls[m.name]
                return self.score(env, m, n) + self.learn.bandit_c * math.sqrt(log_t / n)

            chosen = max(self.methods, key=ucb)  # ties: the earlier method
            pulls[chosen.name] += 1
            self.ensure(env, [chosen], pulls[chosen.name])
        best = max(self.methods, key=lambda m: self.score(env, m, pulls[m.name]))
        return {
            "score": self.score(env, best, pulls[best.name]),
            "method": best.name,
            "iterations": pulls,
        }

    # ------------------------------------------------------------------ the whole run
    def run(self) -> dict[str, Any]:
        self._claim()
        try:
            for env in self.envs:
                self.root(env)
                self.ensure(env, self.methods, self.learn.iterations)
                if self.learn.bandit:
                    self._bandit[env.title()] = self.bandit(env)
                self.write_summary()
        finally:
            self.evaluator.close()
        return self.write_summary(final=True)

    def _method_entry(self, env: LearnEnv, method: Method, upto: int) -> dict[str, Any]:
        """``method``'s result on ``env`` after ``upto`` iterations, with what it cost."""
        recs = self.lineage(env, method).records[:upto]
        kept = self.kept(env, method, upto)
        return {
            "score": round(kept.metrics.val_reward, 4),
            "kept": kept.id,
            "val_success": round(kept.metrics.val_success, 4),
            "val_success_interval": [
                round(kept.metrics.val_success_low, 4),
                round(kept.metrics.val_success_high, 4),
            ],
            "iterations": upto,
            "curve": [round(self.score(env, method, j), 4) for j in range(upto + 1)],
            "optimizer_tokens": sum(r.optimizer_tokens for r in recs),
            "eval_tokens": sum(r.eval_tokens for r in recs),
            "wall_s": round(sum(r.wall_s for r in recs), 1),
            "candidates": sum(1 for r in recs if r.child is not None and r.new),
            "unchanged": dict(Counter(r.reason.split(":")[0] for r in recs if r.child is None)),
            "cost_tokens_per_episode": round(kept.metrics.cost_tokens, 1),
        }

    def write_summary(self, final: bool = False) -> dict[str, Any]:
        K = self.learn.iterations
        probe = self.learn.probe_iterations
        started = [e for e in self.envs if self.started(e)]
        done_envs = [e for e in started if all(len(self.lineage(e, m).records) >= K for m in self.methods)]
        methods: dict[str, Any] = {}
        for m in self.methods:
            per_env = {}
            for e in started:
                per_env[e.title()] = self._method_entry(e, m, min(len(self.lineage(e, m).records), K))
            complete = [per_env[e.title()]["score"] for e in done_envs]
            methods[m.name] = {"per_env": per_env, "mean": _mean(complete)}
        per_env: dict[str, Any] = {}
        for e in done_envs:
            scores = {m.name: methods[m.name]["per_env"][e.title()]["score"] for m in self.methods}
            probes = {m.name: self.score(e, m, min(probe, K)) for m in self.methods}
            picked = max(self.methods, key=lambda m: probes[m.name]).name
            best = max(scores, key=lambda k: scores[k])
            per_env[e.title()] = {
                "baseline": round(self.store(e).find(Components()).metrics.val_reward, 4),
                "scores": scores,
                "upper_bound": {"method": best, "score": scores[best]},
                "adaptive": {"method": picked, "probe_scores": probes, "score": scores[picked]},
            }
        envs = list(per_env)
        best_single = max(self.methods, key=lambda m: methods[m.name]["mean"]).name if envs else None
        summary: dict[str, Any] = {
            "final": final,
            "envs": [e.title() for e in self.envs],
            "envs_done": envs,
            "iterations": K,
            "methods": methods,
            "per_env": per_env,
            "baseline": _table({e: per_env[e]["baseline"] for e in envs}),
            "best_single": {
                "method": best_single,
                **_table({e: per_env[e]["scores"][best_single] for e in envs} if best_single else {}),
            },
            "adaptive": _table({e: per_env[e]["adaptive"]["score"] for e in envs}),
            "upper_bound": _table({e: per_env[e]["upper_bound"]["score"] for e in envs}),
            "wall_s": round(time.perf_counter() - self._start, 1),
        }
        bandit = {e: self._bandit[e] for e in envs if e in self._bandit}
        if bandit:
            summary["allocation"] = {
                "budget_per_env": len(self.methods) * K,
                "even": _table({e: per_env[e]["upper_bound"]["score"] for e in bandit}),
                "bandit": {**_table({e: bandit[e]["score"] for e in bandit}), "detail": bandit},
            }
        write_text_atomic(self.run_dir / "learn.json", json.dumps(summary, indent=2) + "\n")
        return summary


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def _table(per_env: dict[str, float]) -> dict[str, Any]:
    return {"per_env": per_env, "mean": _mean(list(per_env.values()))}
