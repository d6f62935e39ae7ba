"""Affinities: entropic (perplexity-calibrated) Gaussian affinities."""
from .entropic import EntropicAffinities, entropic_affinities

__all__ = ["EntropicAffinities", "entropic_affinities"]
