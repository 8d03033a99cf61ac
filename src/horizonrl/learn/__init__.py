"""Component-centric agent learning (AutoEnv's formalization, with the model as a component).

Four objects: a **candidate** (one version of the agent: :mod:`.candidate`), its **components**
(prompt, agent code, model weights), the **trajectories** it produced and its **metrics**. Three
stages: **selection** (:mod:`.select`: best, Pareto over reward and cost), **optimization**
(:mod:`.optimize`: dynamics- and instruction-based through the optimizer role; :mod:`.model_opt`:
SFT and GRPO with our trainers) and **evaluation** (:mod:`.evaluate`). A method is one selection,
one optimization and its target (:mod:`.methods`); :mod:`.run` runs methods per env, chooses a
method per env, and writes ``learn.json``.
"""
