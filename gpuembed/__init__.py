"""gpuembed: fast nonlinear embeddings and manifold learning on GPU and CPU."""
from . import datasets, metrics, nbody, objectives, optim, parametric
from ._checks import NotFittedError
from .affinities import entropic_affinities, multiscale_affinities
from .backend import Backend, BackendUnavailable, get_backend
from .embedding import EE, SNE, SSNE, TSNE, MultiscaleSNE
from .neighbors import knn
from .neighbors_ivf import ListIndex, approx_knn, approx_knn_query
from .parametric import ParametricEmbedding
from .spectral import LaplacianEigenmaps, SpectralClustering

__version__ = "0.1.0"

__all__ = ["Backend", "BackendUnavailable", "NotFittedError", "get_backend", "knn",
           "approx_knn", "approx_knn_query", "ListIndex", "entropic_affinities",
           "multiscale_affinities", "TSNE", "SSNE", "EE", "SNE", "MultiscaleSNE",
           "ParametricEmbedding", "LaplacianEigenmaps", "SpectralClustering", "datasets",
           "metrics", "nbody", "objectives", "optim", "parametric", "__version__"]
