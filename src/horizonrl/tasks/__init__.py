"""Task factories and filters: SWE-smith-style bug injection into real packages, pass-rate filtering."""
