"""Lightning's ``ModelCheckpoint``, holding to ``save_top_k`` as a resumed run gives it.

Restored from a checkpoint, Lightning's keeps the list of best checkpoints it saved then, and deletes
the worst only when that list is exactly ``save_top_k`` long. So a run resumed with a lower
``save_top_k`` (to free space after its disk filled up) would delete nothing and fill the disk again.
Here, once training starts (after the restore), the list is cut to ``save_top_k``: the best kept, the
files of the others deleted (rank 0, and only inside this checkpoint's own folder).
"""

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class TopKCheckpoint(ModelCheckpoint):
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if 0 <= self.save_top_k < len(self.best_k_models):
            self._keep_best(trainer, self.save_top_k)

    def _keep_best(self, trainer: L.Trainer, k: int) -> None:
        ranked = sorted(self.best_k_models, key=lambda path: float(self.best_k_models[path]))
        if self.mode == "max":
            ranked.reverse()  # best first
        for path in ranked[k:]:
            del self.best_k_models[path]
            if self.dirpath and Path(path).resolve().parent == Path(self.dirpath).resolve():
                trainer.strategy.remove_checkpoint(path)
        kept = ranked[:k]
        self.best_model_path = kept[0] if kept else ""
        self.best_model_score = self.best_k_models[kept[0]] if kept else None
        self.kth_best_model_path = kept[-1] if kept else ""
        self.kth_value = self.best_k_models[kept[-1]] if kept else self.kth_value
