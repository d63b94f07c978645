"""Which samples a rank reads at each step: its contiguous slice of the global batch, optionally shuffled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def to_device(x: Any, device: Any) -> Any:
    """A batch's tensors on ``device``: one tensor, or a tuple/list of them (a model of several inputs)."""
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(t, device) for t in x)
    if isinstance(x, Mapping):  # a tokenizer's dict batch (an own loop's collate_fn)
        moved = {k: to_device(v, device) for k, v in x.items()}
        try:
            return type(x)(moved)
        except Exception:  # noqa: BLE001 - a mapping type that cannot be rebuilt from a dict
            return moved
    return x.to(device, non_blocking=True) if torch.is_tensor(x) else x


def call_model(model: Any, x: Any) -> Any:
    """``model(x)``, or ``model(*x)`` when the input is a tuple/list: the form ``dl.profile``'s
    ``sample_input`` takes, so a dataset of ``((ids, dense), target)`` drives ``forward(ids, dense)``."""
    return model(*x) if isinstance(x, (tuple, list)) else model(x)


def first_batch(data: Any, n: int) -> tuple[Any, Any]:
    """The first ``min(n, len(data))`` samples of a map-style dataset, collated as a rank reads them."""
    return RankBatches(data, min(n, len(data)), 0, 1, False, 0).get(0)


class RankBatches:
    """Rank r's batch at data position ``pos`` (global samples seen before the step).

    The global batch is positions ``[pos, pos + G)`` with ``G = batch * accumulation * world``;
    rank r's micro-batch i reads ``[pos + (r*accumulation + i)*batch, ...)``, ``batch`` samples:
    every position of the global batch once, each rank's micro-batches side by side. Positions
    wrap around the dataset (epochs); with ``shuffle`` each epoch e reads through
    ``randperm(len, seed + e)``, the same on every rank.
    """

    def __init__(
        self,
        data: Any,
        batch: int,
        rank: int,
        world: int,
        shuffle: bool,
        seed: int,
        accumulation: int = 1,
        collate: Any = None,
    ) -> None:
        """``collate``: a loader's ``collate_fn`` (an own loop's batches are what it makes: tensors,
        tuples, dicts); None: ``(input, target)`` pairs collated as torch's default does."""
        self.data, self.batch, self.rank, self.world = data, batch, rank, world
        self.collate = collate
        self.accumulation = accumulation
        self.shuffle, self.seed = shuffle, seed
        self.n = len(data)
        self._perms: dict[int, torch.Tensor] = {}
        self._tensors = getattr(data, "tensors", None)  # TensorDataset: index all at once
        if (
            self._tensors is None
            and torch.is_tensor(getattr(data, "inputs", None))
            and torch.is_tensor(getattr(data, "targets", None))
        ):
            self._tensors = (data.inputs, data.targets)  # distlab.data.TensorPairs

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._perms = {epoch: torch.randperm(self.n, generator=g)}  # one epoch cached at a time
        return self._perms[epoch]

    def _slice(self, start: int, size: int) -> torch.Tensor:
        """The dataset indices at positions ``[start, start + size)``: a slice of one epoch's order
        when the batch does not cross an epoch (nearly every step: a view, no masks), else
        ``_index``."""
        epoch, first = divmod(start, self.n)
        if first + size > self.n:
            return self._index(torch.arange(start, start + size))
        if not self.shuffle:
            return torch.arange(first, first + size)
        return self._perm(epoch)[first : first + size]

    def _index(self, positions: torch.Tensor) -> torch.Tensor:
        if not self.shuffle:
            return positions % self.n
        epochs = positions // self.n
        out = torch.empty_like(positions)
        for e in epochs.unique().tolist():
            mask = epochs == e
            out[mask] = self._perm(int(e))[positions[mask] % self.n]
        return out

    @property
    def global_batch(self) -> int:
        """Samples of one optimizer step over every rank: the data position advances by this."""
        return self.batch * self.accumulation * self.world

    def get(self, pos: int, micro: int = 0) -> tuple[Any, Any]:
        start = pos + (self.rank * self.accumulation + micro) * self.batch
        idx = self._slice(start, self.batch)
        if self.collate is not None:
            return self.collate([self.data[int(i)] for i in idx])
        if self._tensors is not None:
            x, y = self._tensors[0][idx], self._tensors[1][idx]
            return x, y
        from torch.utils.data import default_collate

        x, y = default_collate([self.data[int(i)] for i in idx])
        return x, y
