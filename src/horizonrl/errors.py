"""User-facing errors.

Every mistake a user can make (a config typo, a wrong model path, an unknown env, a bad data line)
raises a subclass of :class:`HorizonError` whose message names the culprit and what would be valid.
The CLI prints these as one line, without a traceback.
"""


class HorizonError(Exception):
    """Base class for errors caused by user input; the message is meant for the user."""


class ConfigError(HorizonError):
    """A config file or override is invalid (unknown key, bad value)."""


class DataError(HorizonError):
    """A data file (tasks, trajectories) is missing or has a bad line."""


class ModelLoadError(HorizonError):
    """A model or tokenizer could not be found or loaded."""


class UnknownEnvError(HorizonError):
    """No env is registered under the requested name."""


class CheckpointError(HorizonError):
    """A checkpoint is missing, corrupt or does not match the run."""


class TrainingError(HorizonError):
    """Training cannot go on safely (e.g. a non-finite loss); the message names the trajectories."""
