"""The HumanEval problems the traces use, by task id: (entry point, prompt)."""

from prompts_a import PROMPTS as _A
from prompts_b import PROMPTS as _B

PROMPTS: dict[str, tuple[str, str]] = {**_A, **_B}
