"""Rankers (plain `nn.Module`s, in `rankers/`) and the one LightningModule family that trains them."""
