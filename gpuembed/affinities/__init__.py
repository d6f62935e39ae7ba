"""Affinities: entropic (perplexity-calibrated) Gaussian affinities, single and multi-scale."""
from .entropic import EntropicAffinities, entropic_affinities
from .multiscale import MultiscaleAffinities, multiscale_affinities
from .orders import raster_order

__all__ = ["EntropicAffinities", "entropic_affinities", "MultiscaleAffinities",
           "multiscale_affinities", "raster_order"]
