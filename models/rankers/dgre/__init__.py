"""DGRe (disentangled graph ranking): the ranker (ranker.py) and one file per concern.

The disentangled graph (masking.py, Eq. 7-10), the GGNN refinement (ggnn.py, Eq. 11-12), the decomposition layer
(decomposition.py, Eq. 13-15), the triangle distance (losses.py, Eq. 18-21) and the MINE mutual information terms
(mi.py, Eq. 22-24).
"""

from models.rankers import RANKERS
from models.rankers.dgre.ranker import DGRe, DGReConfig, DGReOutput


@RANKERS.register("dgre", schema=DGReConfig, capabilities=DGRe.capabilities)
def build(cfg: DGReConfig) -> DGRe:
    """Build DGRe for `model.name: dgre`."""
    return DGRe(cfg)


__all__ = ["DGRe", "DGReConfig", "DGReOutput", "build"]
