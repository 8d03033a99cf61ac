"""The ``roles:`` block of a recipe: which backend serves each LLM role.

```yaml
roles:
  default: {backend: policy}                       # every role not named below
  judge:
    backend: openai                                # any OpenAI-compatible endpoint
    base_url: http://localhost:8000/v1             # e.g. a vLLM server, or horizon serve
    model: Qwen2.5-7B-Instruct
    api_key_env: OPENAI_API_KEY                    # the key is read from this variable
  synthesizer: {backend: local, path: /models/qwen2.5-1.5b-instruct, temperature: 0.7}
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the roles HorizonRL's systems ask for (a key outside these, or ``default``, is a typo)
ROLE_NAMES = (
    "explorer",
    "synthesizer",
    "judge",
    "extractor",
    "coder",
    "optimizer",
    "annotator",
    "verifier",
)


class RoleConfig(BaseModel):
    """One role's backend and default sampling."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["policy", "local", "openai"] = Field(
        "policy",
        description="'policy': the run's own engine (current weights); 'local': another Hugging Face model "
        "in this process (path); 'openai': an OpenAI-compatible endpoint (base_url, model, api_key_env).",
    )
    path: str | None = Field(
        None, description="local: the model (a directory, or smollm2-135m / tiny-random)."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="local: the weights' dtype.")
    base_url: str | None = Field(None, description="openai: the endpoint, e.g. https://api.openai.com/v1.")
    model: str | None = Field(None, description="openai: the model id the endpoint serves.")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="openai: the environment variable holding the API key (never the key)."
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Default sampling temperature (0: greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Default nucleus sampling mass.")
    max_tokens: int = Field(512, ge=1, le=131_072, description="Default most tokens of a reply.")
    timeout_s: float = Field(120.0, gt=0, description="openai: seconds before a request is abandoned.")
    max_retries: int = Field(2, ge=0, le=10, description="openai: retries after a failed request.")
    concurrency: int = Field(16, ge=1, le=4_096, description="Most requests of this role in flight at once.")
    structured: Literal["enforce", "parse"] = Field(
        "enforce",
        description="Replies that must have a structure: 'enforce' holds them to the schema (the engine's "
        "constrained decoding; response_format json_schema strict on openai); 'parse' reads free text, for "
        "endpoints that can do neither.",
    )

    @model_validator(mode="after")
    def _fields_of_backend(self) -> RoleConfig:
        if self.backend == "local" and not self.path:
            raise ValueError("backend local needs path (a model directory, or smollm2-135m)")
        if self.backend == "openai" and not (self.base_url and self.model):
            raise ValueError("backend openai needs base_url and model")
        if self.backend != "local" and self.path:
            raise ValueError(f"path is for backend local, not {self.backend}")
        if self.backend != "openai" and (self.base_url or self.model):
            raise ValueError(f"base_url and model are for backend openai, not {self.backend}")
        return self


class RolesConfig(BaseModel):
    """Which backend serves each role; roles not named use ``default``."""

    model_config = ConfigDict(extra="forbid")

    default: RoleConfig = Field(default_factory=RoleConfig, description="Every role not named here.")
    explorer: RoleConfig | None = Field(None, description="Explores an environment (self-questioning).")
    synthesizer: RoleConfig | None = Field(None, description="Writes tasks from explored states.")
    judge: RoleConfig | None = Field(None, description="Scores steps or answers (attribution, rewards).")
    extractor: RoleConfig | None = Field(None, description="Distils experiences from trajectories.")
    coder: RoleConfig | None = Field(None, description="Writes code (environments, agents).")
    optimizer: RoleConfig | None = Field(None, description="Rewrites prompts and agent components.")
    annotator: RoleConfig | None = Field(None, description="Labels failure modes in trajectories.")
    verifier: RoleConfig | None = Field(None, description="Checks a proposed solution (multi-agent).")

    def for_role(self, name: str) -> RoleConfig:
        if name != "default" and name not in ROLE_NAMES:
            raise KeyError(name)
        return getattr(self, name) or self.default
