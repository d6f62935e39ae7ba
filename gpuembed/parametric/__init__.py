"""Parametric embeddings: MAC (mac.py), mappings (mappings.py) and the chain-rule
baseline (chainrule.py)."""
from .chainrule import chain_rule
from .mac import ParametricEmbedding
from .mappings import MAPPINGS, LinearMapping, MLPMapping, RBFMapping, make_mapping

__all__ = ["ParametricEmbedding", "LinearMapping", "RBFMapping", "MLPMapping", "MAPPINGS",
           "make_mapping", "chain_rule"]
