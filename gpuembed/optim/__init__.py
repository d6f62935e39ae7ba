"""Optimizers: partial-Hessian directions, line search, classic t-SNE, homotopy."""
from .directions import DIRECTIONS
from .loop import Monitor, Result, homotopy, homotopy_path, minimize, tsne_classic

OPTIMIZERS = tuple(DIRECTIONS) + ("tsne",)

__all__ = ["DIRECTIONS", "OPTIMIZERS", "Monitor", "Result", "minimize", "tsne_classic",
           "homotopy", "homotopy_path"]
