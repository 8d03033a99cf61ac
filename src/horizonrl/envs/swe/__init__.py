"""The ``swe`` env: repository repair in a sandbox with CodeAct tools, rewarded by the tests."""
