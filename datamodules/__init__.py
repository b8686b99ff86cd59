"""Data: one internal form (`IRDataset`), the sources that produce it, and the LightningDataModule.

The data module serves training triplets and evaluation candidates (optionally rotation-debiased) from the
`IRDataset`.
"""
