"""Data: one internal form (`IRDataset`), sources that produce it, and the LightningDataModule that serves
training triplets and evaluation candidates (optionally rotation-debiased) from it.
"""
