"""gpuembed: fast nonlinear embeddings and manifold learning on GPU and CPU."""
from . import datasets, metrics
from .affinities import entropic_affinities
from .backend import Backend, BackendUnavailable, get_backend
from .neighbors import knn

__version__ = "0.1.0"

__all__ = ["Backend", "BackendUnavailable", "get_backend", "knn", "entropic_affinities",
           "datasets", "metrics", "__version__"]
