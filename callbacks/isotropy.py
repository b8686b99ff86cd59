"""Logs I(W) (isotropy paper Eq. 3) and avgcos (Eq. 4) of a ranker's representations at every validation and test.

Measured on a fixed, seeded probe set (validation queries and candidate passages, `RankingDataModule.probe_texts`)
so the curves over training compare like with like:
- `iw`, `avgcos`: token vectors of queries and passages (padding excluded), the vectors ColBERT scores with;
- `iw_sequence`, `avgcos_sequence`: one vector per text (the ranker's pooled vector; the mean of its unit
  token vectors for ColBERT).
Vectors are whatever the ranker scores with, as its score function compares them (`scoring_vectors`): unit length
for the cosine rankers (ColBERT, RepBERT), as the paper's ColBERT normalises its output embeddings; I(W) of
unnormalised vectors is dominated by a few long held-out vectors (exp of their projections) and drops towards 0
for reasons that the cosine score never sees. With an isotropy head attached these are the head's outputs, and
the same four are logged for the raw representations under `*_raw` (the "Ft" column of the isotropy paper's
tables next to "Ft -> head"), from the same backbone pass.
The metric states are torchmetrics states: under DDP each rank encodes its shard and `compute()` syncs.
Cross-encoders have no separate query/passage representations and are skipped.
"""
from __future__ import annotations

import torch
from pytorch_lightning import Callback

from callbacks.metrics.isotropy import AvgCos, IsotropyIW
from lightning_modules.rankers.base import masked_mean


class IsotropyCallback(Callback):
    def __init__(self, batch_size: int = 32, max_vectors: int = 20000):
        self.batch_size = batch_size
        self.max_vectors = max_vectors

    @torch.inference_mode()
    def measure(self, trainer, module) -> dict[str, float]:
        ranker = module.ranker
        if ranker.kind != "bi":
            return {}
        has_head = ranker.token_head is not None or ranker.sequence_head is not None
        variants = ("", "_raw") if has_head else ("",)
        metrics = {}
        for v in variants:
            metrics.update({
                f"iw{v}": IsotropyIW(max_vectors=self.max_vectors), f"avgcos{v}": AvgCos(),
                f"iw_sequence{v}": IsotropyIW(max_vectors=self.max_vectors), f"avgcos_sequence{v}": AvgCos(),
            })
        for m in metrics.values():
            m.to(module.device)
        tok = module.pair_tokenizer
        queries, docs = trainer.datamodule.probe_texts()
        was_training = ranker.training
        ranker.eval()
        for texts, tokenize, side in ((queries, tok.queries, "query"), (docs, tok.docs, "doc")):
            for s in range(0, len(texts), self.batch_size):
                batch = tokenize(texts[s : s + self.batch_size])
                ids, mask = (v.to(module.device) for v in batch.values())
                with trainer.precision_plugin.forward_context():
                    raw = ranker.token_representations(ids, mask, side=side)
                    encodings = {v: ranker.finish(raw, heads=(v == "")) for v in variants}
                for v, enc in encodings.items():
                    scored = ranker.scoring_vectors(enc.tokens.float())
                    tokens = scored[enc.mask]
                    seq = ranker.scoring_vectors(enc.sequence.float()) if enc.sequence is not None else masked_mean(scored, enc.mask)
                    metrics[f"iw{v}"].update(tokens)
                    metrics[f"avgcos{v}"].update(tokens)
                    metrics[f"iw_sequence{v}"].update(seq)
                    metrics[f"avgcos_sequence{v}"].update(seq)
        ranker.train(was_training)
        return {k: float(m.compute()) for k, m in metrics.items()}

    def _log(self, trainer, module, split: str) -> None:
        values = self.measure(trainer, module)
        module.results.setdefault(split, {})["isotropy"] = values
        for k, v in values.items():
            module.log(f"{split}/{k}", v, sync_dist=False)

    def on_validation_epoch_end(self, trainer, module) -> None:
        if not trainer.sanity_checking:
            self._log(trainer, module, "val")

    def on_test_epoch_end(self, trainer, module) -> None:
        self._log(trainer, module, "test")
