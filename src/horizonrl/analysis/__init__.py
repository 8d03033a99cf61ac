"""Failure analysis: the MAST taxonomy, deterministic detectors, an annotator role, agreement."""
