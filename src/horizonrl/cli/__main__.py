"""``python -m horizonrl.cli``: the ``horizon`` command."""

from horizonrl.cli import main

main()
