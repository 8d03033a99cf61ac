"""``horizon serve``: the policy behind an OpenAI-compatible API, with token capture.

Where each job lives: :mod:`.protocol` (OpenAI's request, response and error shapes),
:mod:`.messages` (OpenAI messages to HorizonRL's, checked), :mod:`.sessions` (a session's tokens as
one schema-v1 trajectory), :mod:`.service` (completions on the engine, weight swaps), :mod:`.app`
(the HTTP routes), :mod:`.server` (running it), :mod:`.external` (training an agent program through
it).
"""
