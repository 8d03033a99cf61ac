"""Training checkpoints that survive crashes: atomic saves, checksums, strict loading.

Layout of one checkpoint::

    run_dir/checkpoints/step_000010/
        policy/              the policy artifact (horizonrl.policy): loads by itself with horizon,
                             transformers and peft; a LoRA run's trained adapter is its last stage
        optimizer.pt         optimizer.state_dict()
        trainer_state.json   the caller's dict (always with "step")
        rng.pt               python, numpy and torch RNG states
        modules.pt           (optional) state dicts of extra trained modules, e.g. a value head
        manifest.json        written last: format, step, kind and the sha256 of every other file

A checkpoint is built in a hidden ``.step_000010.tmp-<pid>@<host>`` directory and renamed into
place, so a crash mid-save never leaves a half checkpoint under a final name; only directories with a
``manifest.json`` count as checkpoints, and :func:`verify_checkpoint` checks every file's checksum.
What a killed save leaves behind is removed by a later save, once its writer (the pid and host in
its name) is dead; a live writer's is never touched. A save that fails for a full disk or a
read-only file system raises a one-line :class:`~horizonrl.errors.StorageError` and leaves the
checkpoints as they were.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horizonrl.checksums import first_problem, sha256_file
from horizonrl.errors import CheckpointError, storage_error
from horizonrl.io import fsync_dir, fsync_file, remove_stale_temps, temp_sibling

FORMAT = 2  # 1: model/ held the trained adapter alone, which did not load as the policy
CHECKPOINTS_DIR = "checkpoints"
MANIFEST = "manifest.json"
POLICY_DIR = "policy"
OPTIMIZER_FILE = "optimizer.pt"
TRAINER_STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"
MODULES_FILE = "modules.pt"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
FULL_WEIGHTS = "model.safetensors"
FULL_WEIGHTS_INDEX = "model.safetensors.index.json"
_STEP_DIR = re.compile(r"step_(\d{6,})")
_NAMES_SHOWN = 5


def _step_name(step: int) -> str:
    return f"step_{step:06d}"


def policy_dir(path: Path) -> Path:
    """The directory holding a checkpoint's policy artifact (adapter or full model)."""
    return Path(path) / POLICY_DIR


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def _few(names: list[str] | set[str]) -> str:
    """A short, readable listing of some names."""
    names = sorted(names)
    shown = ", ".join(names[:_NAMES_SHOWN])
    return shown + (f" (and {len(names) - _NAMES_SHOWN} more)" if len(names) > _NAMES_SHOWN else "")


# ---------------------------------------------------------------------------------------------------
# files on disk


def _remove_dir(path: Path) -> None:
    """Delete a directory, first renaming it to a hidden temporary name so a crash mid-delete
    never leaves a partial directory under a checkpoint name."""
    doomed = temp_sibling(path, "del")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: Any,
    optimizer: Any,
    trainer_state: dict[str, Any],
    keep_last: int | None = 3,
    modules: dict[str, Any] | None = None,
    write_policy: Callable[[Path], None] | None = None,
    write_extras: Callable[[Path], None] | None = None,
) -> Path:
    """Save a checkpoint of ``step`` atomically under ``run_dir/checkpoints``; return its path.

    An existing checkpoint of the same step (a re-save after resuming) is replaced. Afterwards only
    the ``keep_last`` highest-step checkpoints are kept (all with ``None``); the one just written
    is never pruned. Leftover temporary directories of interrupted saves are removed first.
    ``modules`` (name -> ``torch.nn.Module``) are trained modules outside ``model`` (a value head).
    ``write_policy(out)`` writes the policy artifact (the run's, with its base identity and earlier
    adapter stages); by default it is ``model``'s alone. ``write_extras(dir)`` writes more state
    into the checkpoint (e.g. the experience pool); its files are hashed with the rest.
    """
    from horizonrl import policy as artifact

    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    state = dict(trainer_state)
    if state.setdefault("step", step) != step:
        raise ValueError(f"trainer_state['step'] is {state['step']} but the checkpoint is for step {step}")

    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(root)  # saves or deletions of writers that were killed

    name = _step_name(step)
    final = root / name
    tmp = temp_sibling(final)
    try:
        tmp.mkdir()
        kind = "adapter" if _is_peft(model) else "full"
        if write_policy is None:
            artifact.write_policy(policy_dir(tmp), model=model, tokenizer=None, base=None)
        else:
            write_policy(policy_dir(tmp))
        _torch_save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        (tmp / TRAINER_STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        _torch_save(_rng_state(), tmp / RNG_FILE)
        if modules:
            _torch_save({k: m.state_dict() for k, m in modules.items()}, tmp / MODULES_FILE)
        if write_extras is not None:
            write_extras(tmp)

        files: dict[str, str] = {}
        for file in sorted(p for p in tmp.rglob("*") if p.is_file()):
            fsync_file(file)
            files[file.relative_to(tmp).as_posix()] = sha256_file(file)
        manifest = {"format": FORMAT, "step": step, "kind": kind, "files": files}
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for directory in [p for p in tmp.rglob("*") if p.is_dir()] + [tmp]:
            fsync_dir(directory)

        if final.exists():
            _remove_dir(final)
        os.replace(tmp, final)
        fsync_dir(root)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        error = storage_error(exc, final) if isinstance(exc, Exception) else None
        if error is not None:
            raise error from None
        raise

    if keep_last is not None:
        older = [p for p in list_checkpoints(run_dir) if p != final]
        for old in older[: max(0, len(older) - (keep_last - 1))]:
            _remove_dir(old)
        fsync_dir(root)
    return final


def _torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through a Python file, so that a full disk is an OSError (ENOSPC), not
    torch's RuntimeError about a stream position."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Finished checkpoints of a run (``step_NNNNNN`` directories with a manifest), by step."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.fullmatch(path.name)
        if match and path.is_dir() and (path / MANIFEST).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest-step finished checkpoint of a run, or ``None``.

    It is not verified: call :func:`verify_checkpoint` (or :func:`load_training_state`) on it.
    """
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check that ``path`` is a finished, intact checkpoint; return its manifest.

    Raises :class:`CheckpointError` naming the checkpoint and the culprit when the directory or its
    manifest is missing or invalid, a listed file is missing, or a file's checksum does not match.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"Checkpoint {str(path)!r} does not exist (or is not a directory).")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is not a finished checkpoint (no {MANIFEST}): it may have been "
            "interrupted while saving."
        ) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not isinstance(manifest.get("step"), int):
        raise CheckpointError(f"Checkpoint {str(path)!r} has an invalid {MANIFEST} (no 'step' or 'files').")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} has format {manifest.get('format')!r}; "
            f"this version reads format {FORMAT}."
        )
    if manifest.get("kind") not in ("adapter", "full"):
        raise CheckpointError(f"Checkpoint {str(path)!r} has an unknown kind {manifest.get('kind')!r}.")
    problem = first_problem(path, files)
    if problem is not None:
        raise CheckpointError(f"Checkpoint {str(path)!r} is not intact: {problem}.")
    return manifest


# ---------------------------------------------------------------------------------------------------
# RNG


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is optional
        pass
    if torch.cuda.is_available():  # pragma: no cover - CPU test machines
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state.get("numpy") is not None:
        try:
            import numpy as np

            np.random.set_state(state["numpy"])
        except ImportError:  # pragma: no cover
            pass
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)  # pragma: no cover


# ---------------------------------------------------------------------------------------------------
# loading


def _check_optimizer(path: Path, saved: dict[str, Any], optimizer: Any) -> None:
    """Raise :class:`CheckpointError` when the saved optimizer state cannot belong to ``optimizer``."""
    saved_groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(saved_groups, list) or not isinstance(saved.get("state"), dict):
        raise CheckpointError(f"Checkpoint {str(path)!r}: {OPTIMIZER_FILE} is not an optimizer state dict.")
    groups = optimizer.param_groups
    if len(saved_groups) != len(groups):
        raise CheckpointError(
            f"Checkpoint {str(path)!r}: the checkpoint's optimizer has {len(saved_groups)} parameter groups, "
            f"this run has {len(groups)}."
        )
    hint = "was it saved with different LoRA settings or fine-tuning mode?"
    for g, (saved_group, group) in enumerate(zip(saved_groups, groups, strict=True)):
        ids, params = saved_group["params"], group["params"]
        if len(ids) != len(params):
            raise CheckpointError(
                f"Checkpoint {str(path)!r}: the checkpoint's optimizer has {len(ids)} parameter tensors in "
                f"group {g}, this run has {len(params)}: {hint}"
            )
        for i, (pid, param) in enumerate(zip(ids, params, strict=True)):
            for key, value in saved["state"].get(pid, {}).items():
                shape = getattr(value, "shape", None)
                if shape is not None and len(shape) > 0 and tuple(shape) != tuple(param.shape):
                    raise CheckpointError(
                        f"Checkpoint {str(path)!r}: optimizer state {key!r} of parameter {i} in group {g} "
                        f"has shape {tuple(shape)}, this run's parameter has shape {tuple(param.shape)}: "
                        f"{hint}"
                    )


def _check_tensors(path: Path, loaded: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """Raise when ``loaded`` and ``expected`` tensors differ in names or shapes."""
    missing = set(expected) - set(loaded)
    unexpected = set(loaded) - set(expected)
    problems = []
    if missing:
        problems.append(f"missing {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected {_few(unexpected)}")
    mismatched = [
        f"{k} {tuple(loaded[k].shape)} vs {tuple(expected[k].shape)} in this run"
        for k in sorted(set(loaded) & set(expected))
        if tuple(loaded[k].shape) != tuple(expected[k].shape)
    ]
    if mismatched:
        problems.append(f"shape mismatch: {_few(mismatched)}")
    if problems:
        raise CheckpointError(
            f"Checkpoint {str(path)!r}: the {what} does not match this run's model ({'; '.join(problems)})."
        )


def _load_file(path: Path, file: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    if not file.is_file():
        raise CheckpointError(f"Checkpoint {str(path)!r} has no {file.relative_to(path).as_posix()}.")
    try:
        return load_file(file)
    except Exception as exc:
        raise CheckpointError(f"Checkpoint {str(path)!r}: cannot read {file.name}: {exc}") from exc


def _prepare_adapter(path: Path, model: Any) -> dict[str, Any]:
    """Read and check the adapter weights for ``model``'s active adapter."""
    from peft import get_peft_model_state_dict

    from horizonrl.policy import trained_adapter_dir

    adapter = model.active_adapter
    try:
        folder = trained_adapter_dir(policy_dir(path))  # its files were verified with the checkpoint
    except Exception as exc:
        raise CheckpointError(f"Checkpoint {str(path)!r}: {exc}") from None
    weights = _load_file(path, folder / ADAPTER_WEIGHTS)
    expected = get_peft_model_state_dict(model, adapter_name=adapter, save_embedding_layers=False)
    _check_tensors(path, weights, expected, f"LoRA adapter {adapter!r}")
    return weights


def _prepare_full(path: Path, model: Any) -> dict[str, Any]:
    """Read the full weights (single file or shards) and check them against ``model``."""
    folder = policy_dir(path)
    index = folder / FULL_WEIGHTS_INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        weights: dict[str, Any] = {}
        for shard in shards:
            weights.update(_load_file(path, folder / shard))
    else:
        weights = _load_file(path, folder / FULL_WEIGHTS)
    current = model.state_dict()
    # save_pretrained drops tied weights (e.g. lm_head tied to the embeddings); they need not be loaded.
    loaded_ptrs = {current[k].data_ptr() for k in weights if k in current}
    expected = {k: v for k, v in current.items() if k in weights or v.data_ptr() not in loaded_ptrs}
    _check_tensors(path, weights, expected, "model weights")
    return weights


def _prepare_modules(path: Path, modules: dict[str, Any]) -> dict[str, Any]:
    """The saved state dicts of ``modules``, checked against them (names, keys and shapes)."""
    import torch

    file = path / MODULES_FILE
    if not file.is_file():
        raise CheckpointError(
            f"Checkpoint {str(path)!r} holds no {MODULES_FILE} but this run trains {_few(list(modules))}."
        )
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"Checkpoint {str(path)!r}: {MODULES_FILE} cannot be read: {exc}") from exc
    missing = set(modules) - set(saved)
    if missing:
        raise CheckpointError(f"Checkpoint {str(path)!r}: {MODULES_FILE} lacks the modules {_few(missing)}.")
    for name, module in modules.items():
        _check_tensors(path, saved[name], module.state_dict(), f"module {name!r}")
    return saved


def load_training_state(
    path: Path, optimizer: Any, model: Any = None, modules: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Restore a run from checkpoint ``path``; return its trainer state.

    Verifies the checkpoint, checks that the saved optimizer (and, if ``model`` is given, the saved
    weights) match this run, and only then loads the optimizer state, the model weights (the
    adapter of a PEFT model, else full weights), the extra ``modules`` and the RNG states. Any mismatch raises
    :class:`CheckpointError` naming what differs, before anything is changed.
    """
    import torch

    path = Path(path)
    manifest = verify_checkpoint(path)
    try:
        trainer_state = json.loads((path / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
        opt_state = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=False)
        rng = torch.load(path / RNG_FILE, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"Checkpoint {str(path)!r} cannot be read: {exc}") from exc
    if not isinstance(trainer_state, dict):
        raise CheckpointError(f"Checkpoint {str(path)!r}: {TRAINER_STATE_FILE} is not a JSON object.")
    _check_optimizer(path, opt_state, optimizer)

    weights = None
    if model is not None:
        peft = _is_peft(model)
        if manifest["kind"] == "adapter" and not peft:
            raise CheckpointError(
                f"Checkpoint {str(path)!r} holds a LoRA adapter but this run's model is not a PEFT model "
                "(finetune=full?)."
            )
        if manifest["kind"] == "full" and peft:
            raise CheckpointError(
                f"Checkpoint {str(path)!r} holds full model weights but this run's model is a PEFT model "
                "(finetune=lora?)."
            )
        weights = _prepare_adapter(path, model) if peft else _prepare_full(path, model)

    saved_modules = _prepare_modules(path, modules) if modules else {}

    try:
        optimizer.load_state_dict(opt_state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"Checkpoint {str(path)!r}: the optimizer state does not load: {exc}") from exc
    if weights is not None:
        if _is_peft(model):
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(model, weights, adapter_name=model.active_adapter)
            if result.unexpected_keys:
                raise CheckpointError(
                    f"Checkpoint {str(path)!r}: unexpected adapter keys {_few(result.unexpected_keys)}."
                )
        else:
            model.load_state_dict(weights, strict=False)
    for name, module in (modules or {}).items():
        module.load_state_dict(saved_modules[name])
    _set_rng_state(rng)
    return trainer_state


# ---------------------------------------------------------------------------------------------------
# what a user passes as --checkpoint

ACCEPTED = (
    "a run directory (its final policy/, else its latest checkpoint), a checkpoints/step_N directory, "
    "a policy or PEFT adapter directory (adapter_config.json), or a model directory (config.json)"
)


def resolve_policy(path: Path) -> Path:
    """The policy directory meant by ``path``: a run directory (its ``policy/``, or the policy of
    its latest finished checkpoint), a checkpoint (verified), or a policy, adapter or model
    directory itself. Anything else raises :class:`CheckpointError` naming what was found."""
    from horizonrl.policy import MANIFEST as POLICY_MANIFEST

    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"--checkpoint {str(path)!r} does not exist; accepted: {ACCEPTED}")
    if not path.is_dir():
        raise CheckpointError(f"--checkpoint {str(path)!r} is a file, not a directory; accepted: {ACCEPTED}")
    if (path / POLICY_MANIFEST).is_file() or (path / "adapter_config.json").is_file():
        return path
    if (path / MANIFEST).is_file() and _STEP_DIR.fullmatch(path.name):
        verify_checkpoint(path)
        return policy_dir(path)
    if (path / POLICY_DIR / POLICY_MANIFEST).is_file():
        return path / POLICY_DIR
    if (path / CHECKPOINTS_DIR).is_dir() or (path / "config.yaml").is_file():
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(
                f"--checkpoint {str(path)!r} is a run directory with no policy/ and no finished checkpoint "
                f"under {CHECKPOINTS_DIR}/ (did the run stop before its first save?)"
            )
        verify_checkpoint(latest)
        return policy_dir(latest)
    if (path / "config.json").is_file():
        return path
    found = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    shown = ", ".join(found[:6]) + (" ..." if len(found) > 6 else "") if found else "an empty directory"
    raise CheckpointError(f"--checkpoint {str(path)!r} is not a policy (found {shown}); accepted: {ACCEPTED}")
