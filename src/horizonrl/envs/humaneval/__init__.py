"""The ``humaneval`` env: OpenAI's HumanEval problems, solved in a sandbox and graded by their hidden
tests (:mod:`.env`); the problems, splits and the programs that run a solution (:mod:`.problems`)."""
