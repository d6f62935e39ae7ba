"""Spectral methods."""
from .embedding import spectral_embedding

__all__ = ["spectral_embedding"]
