"""The trajectory viewer (``horizon view``): a local web app over run directories.

- :mod:`horizonrl.view.lines`: complete lines of a growing JSONL file, read incrementally
- :mod:`horizonrl.view.summary`: one trajectory line's summary (fast head/tail parse, full fallback)
- :mod:`horizonrl.view.index`: which runs and trajectory files there are; the per-run line index
- :mod:`horizonrl.view.runinfo`: a run's config, summary, status and metric series
- :mod:`horizonrl.view.catalog`: the runs a viewer serves, kept between requests
- :mod:`horizonrl.view.query`: filtering and paging the trajectory table
- :mod:`horizonrl.view.tokens`: the token view (tokens decoded one by one, mask, logprob)
- :mod:`horizonrl.view.annotations`: attribution labels, MAST modes and feedback of a trajectory
- :mod:`horizonrl.view.compare`: eval tasks before and after training
- :mod:`horizonrl.view.ratelimit`: a per-client rate limit (the feedback API's)
- :mod:`horizonrl.view.access`: the token (Bearer or cookie) and the security headers of every answer
- :mod:`horizonrl.view.app`: the HTTP API and the static front end
- :mod:`horizonrl.view.server`: serving it on a background thread

See docs/view.md.
"""

from __future__ import annotations

from horizonrl.view.app import create_app
from horizonrl.view.server import ViewerServer

__all__ = ["ViewerServer", "create_app"]
