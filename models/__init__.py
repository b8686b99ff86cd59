"""The models, as plain `nn.Module`s.

Rankers (`models.rankers`), isotropy heads (`models.heads`), how texts are encoded with them (`models.encoding`) and
how a trained one is loaded (`models.loading.load_ranker`). The LightningModules of `lightning_modules/` wrap these
for training and evaluation; analyses and retrieval use them directly.
"""
