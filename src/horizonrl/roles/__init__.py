"""LLM roles: one client for every model call that is not the policy's own turn.

Judges, explorers, task synthesizers, experience extractors, coders, optimizers, annotators and
verifiers all "call an LLM with these messages". Each names a role; the recipe's ``roles:`` block
says which backend serves it (:mod:`.config`), and :class:`Roles` hands out the client:

- ``policy``: the run's own engine, with its current weights (:mod:`.engine`);
- ``local``: another Hugging Face model in this process, with its own engine (:mod:`.engine`);
- ``openai``: any OpenAI-compatible endpoint through the official ``openai`` package — a hosted
  API, a vLLM server, or ``horizon serve`` (:mod:`.openai_backend`).

Systems never construct model clients themselves: ``roles.get("judge").chat(messages)``.
"""

from horizonrl.roles.base import RoleClient, RoleError
from horizonrl.roles.config import ROLE_NAMES, RoleConfig, RolesConfig
from horizonrl.roles.registry import Roles

__all__ = ["ROLE_NAMES", "RoleClient", "RoleConfig", "RoleError", "Roles", "RolesConfig"]
