"""Gradient compressors for the wire: none, fp16, bf16 casts, with optional error feedback."""

from __future__ import annotations

import torch

WIRE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class Compressor:
    """Cast a flat gradient buffer for the wire and back.

    With ``error_feedback`` the rounding error of each buffer is kept and added to the next
    step's buffer before casting (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019), so
    the compression error does not accumulate over steps.
    """

    def __init__(self, kind: str, error_feedback: bool = False) -> None:
        self.kind = kind
        self.dtype = WIRE_DTYPES[kind]
        self.error_feedback = error_feedback and self.dtype is not None
        self._residual: dict[int, torch.Tensor] = {}

    def encode(self, key: int, flat: torch.Tensor) -> torch.Tensor:
        if self.dtype is None:
            return flat
        if self.error_feedback:
            res = self._residual.get(key)
            if res is not None:
                flat = flat + res
        wire = flat.to(self.dtype)
        if self.error_feedback:
            self._residual[key] = flat - wire.to(flat.dtype)
        return wire

    def decode(self, wire: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return wire if wire.dtype == dtype else wire.to(dtype)
