"""gpuembed: fast nonlinear embeddings and manifold learning on GPU and CPU."""
from . import datasets
from .backend import Backend, BackendUnavailable, get_backend
from .neighbors import knn

__version__ = "0.1.0"

__all__ = ["Backend", "BackendUnavailable", "get_backend", "knn", "datasets", "__version__"]
