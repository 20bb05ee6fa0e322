"""Plain supervised training of a classifier on an :class:`ImageSet`, on the CPU.

Used to make the small Fashion-MNIST models of the tests and experiments from nothing:
seeded, so the same call gives the same weights, with a progress bar per epoch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from exporter._datasets import ImageSet
from exporter._rate import distillation_loss

__all__ = ["accuracy", "train_classifier"]


def train_classifier(
    model: nn.Module,
    data: ImageSet,
    epochs: int = 1,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = True,
    teacher: np.ndarray | None = None,
) -> nn.Module:
    """Adam on cross-entropy; returns the model in eval mode. With ``teacher`` (a frozen model's
    logits on each of ``data``'s samples), Hinton's distillation loss instead
    (:func:`exporter._rate.distillation_loss`: KL at a temperature, plus cross-entropy on the labels):
    an early exit learns the full model's answers, not only its labels (issue 48)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    soft = None if teacher is None else torch.from_numpy(np.asarray(teacher, dtype=np.float32))
    model.train()
    for epoch in range(epochs):
        order = torch.from_numpy(rng.permutation(len(data)))
        batches = range(0, len(data), batch_size)
        for start in tqdm(batches, desc=f"epoch {epoch + 1}/{epochs}", unit="batch", disable=not progress):
            idx = order[start : start + batch_size]
            optimiser.zero_grad()
            logits = model(x[idx])
            (loss_fn(logits, y[idx]) if soft is None else distillation_loss(logits, soft[idx], y[idx])).backward()
            optimiser.step()
    return model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, data: ImageSet, batch_size: int = 512) -> float:
    """Top-1 accuracy in eval mode."""
    model.eval()
    correct = 0
    for start in range(0, len(data), batch_size):
        logits = model(torch.from_numpy(data.x[start : start + batch_size]))
        correct += int((logits.argmax(1).numpy() == data.y[start : start + batch_size]).sum())
    return correct / len(data)
