"""Optimizers: partial-Hessian directions, line search, classic t-SNE, homotopy,
accuracy schedules."""
from .directions import DIRECTIONS
from .loop import Monitor, Result, homotopy, homotopy_path, minimize, tsne_classic
from .schedules import accuracy_schedule

OPTIMIZERS = tuple(DIRECTIONS) + ("tsne",)

__all__ = ["DIRECTIONS", "OPTIMIZERS", "Monitor", "Result", "minimize", "tsne_classic",
           "homotopy", "homotopy_path", "accuracy_schedule"]
