"""The SWE dataset's bug-injection factory (``horizon tasks build``): SWE-smith-style bugs injected
into real packages (``mutations``, with its ``operators`` and ``edits``) and kept when the package's
tests catch them (``factory``)."""
