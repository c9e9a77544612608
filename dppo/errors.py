"""User-facing errors: each is reported as one line on stderr with exit code 2."""


class DPPOError(Exception):
    """Base class for errors caused by bad configuration or input, never by a bug."""


class ConfigError(DPPOError):
    """The configuration is invalid; the message says what is wrong and how to fix it."""


class ArgumentError(ConfigError, TypeError):
    """A Python call (``dppo.train``) got a keyword it does not take; a TypeError too, as Python's own would be."""


class PrivacyError(DPPOError):
    """A privacy constraint would be violated (reused user, budget exceeded, bound broken)."""


class DataError(DPPOError):
    """The environment or reward produced unusable data (NaN/inf, a crash mid-episode)."""


class BudgetExhausted(PrivacyError):
    """The next release would exceed ``privacy.max_epsilon``; the run stops cleanly."""


class MissingDependency(ConfigError):
    """An env needs an optional package that is not installed; the message names what to install."""
