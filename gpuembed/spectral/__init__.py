"""Spectral methods: Laplacian eigenmaps, spectral clustering, Locally Linear Landmarks."""
from .embedding import spectral_embedding
from .kmeans import kmeans
from .laplacian import LaplacianEigenmaps, SpectralClustering, affinity_graph
from .lll import choose_landmarks, reconstruction_weights

__all__ = ["spectral_embedding", "kmeans", "LaplacianEigenmaps", "SpectralClustering",
           "affinity_graph", "choose_landmarks", "reconstruction_weights"]
