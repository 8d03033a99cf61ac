"""How tool results are shown to the model (shared by the sandboxed envs)."""

from __future__ import annotations

from horizonrl.sandbox.base import ExecResult


def clip_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and its tail (where a command's
    summary usually is) around a note saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def exec_observation(result: ExecResult, limit: int) -> str:
    """A command's result as the model sees it: its status line, then stdout and stderr."""
    status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    output = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")
    return f"[{status}]\n{clip_middle(output, limit)}"
