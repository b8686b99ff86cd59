"""Vocabulary projections of dense retrievers and lexical enrichment.

Ram et al., "What Are You Token About? Dense Retrieval as Distributions Over the Vocabulary", ACL 2023:
sections 3 (Eq. 1-3), 5, 6 (Eq. 4-5).

`mlm_head` (the MLM head of Eq. 1: the backbone's own, or one fitted by `fit_mlm_head` with the encoder frozen and
the decoder tied to the input embeddings), `projections` (Eq. 3 and the statistics of Table 1-2, Figures 3-5),
`analysis` (`python evaluate.py analysis=vocab_projections`), `enrichment` (Eq. 4-5, lexical enrichment).
"""
