"""Spectral methods: Laplacian eigenmaps, spectral clustering, Locally Linear Landmarks."""
from .embedding import spectral_embedding
from .kmeans import kmeans
from .laplacian import LaplacianEigenmaps, SpectralClustering, affinity_graph, fit_grid
from .linear import kernel_pca_lll, lda_lll, le_landmarks_only, nystrom_le, pca_lll
from .lll import choose_landmarks, landmark_basis, reconstruction_weights

__all__ = ["spectral_embedding", "kmeans", "LaplacianEigenmaps", "SpectralClustering",
           "affinity_graph", "fit_grid", "landmark_basis", "choose_landmarks",
           "reconstruction_weights", "pca_lll", "lda_lll", "kernel_pca_lll", "le_landmarks_only",
           "nystrom_le"]
