"""White-box analysis of ColBERT: term importance, exact vs soft matches and spectral ratio, against IDF.

Formal, Piwowarski & Clinchant, "A White Box Analysis of ColBERT", ECIR 2021, sections 3-4: term importance by
tau_AP (Figure 1), exact vs soft matches Delta_ES (Eq. 2, Figure 2) and the spectral ratio of contextual embeddings
(Figure 3), each against IDF.

One statistic per module: `tau_ap` (AP correlation with ties), `delta_es` (Eq. 2), `spectral` (lambda_1 / sum),
`idf` (collection IDF of words and WordPiece subwords), `words` (query words -> subword positions), `maxsim`
(Eq. 1's C_ij, C*_id and exact matches from the ranker's own token vectors), `collect` (encoding once and the
per-query, per-word computations), `plots` (Figures 1-3) and `analysis` (`python evaluate.py analysis=whitebox`).
"""
