"""What opgym.capture records of residual add + RMSNorm: the calls of the norms opgym.patch fuses with
the residual add before them (their input is the sum, so x and residual have its shape and dtype).
They are recorded by RMSNorm's recorder, which this one tells which norms they are."""
from __future__ import annotations

from .integration import fused_norms


class Recorder:
    def __init__(self, cap):
        self.cap = cap

    @property
    def records(self) -> list[dict]:
        return [r for r in self.cap.recorder("rms_norm").records if r["after_residual_add"]]

    def attach(self, model) -> list:
        self.cap.recorder("rms_norm").after_add_ids |= {id(m) for m in fused_norms(model)}
        return []

    def signatures(self):
        return self.cap.recorder("rms_norm").signatures(after_add_only=True)

    def cases(self, prefix: str) -> list[dict]:
        return self.cap.recorder("rms_norm").cases(prefix, after_add_only=True)
