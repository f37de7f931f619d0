"""What both decode scripts measure the same way: a generate's median gap between tokens (a streamer's times, so
no prefill enters it) and, from a torch.profiler run, Dynamo's guard checks (cache lookups) and compiled regions."""
from __future__ import annotations

import torch

from opgym.run.measure import TokenTimes


def generate_gap_ms(model, inputs: dict, n: int):
    """(median ms between two tokens of a greedy generate of n, the generated sequence)."""
    st = TokenTimes(lambda: None)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=st)
    gaps = sorted(b - a for a, b in zip(st.times[1:], st.times[2:]))  # [prompt, token 1, ...]
    return (gaps[len(gaps) // 2] * 1e3 if gaps else 0.0), out


def dynamo_events(events: dict, attr: str) -> tuple:
    """(compiled regions entered, guard checks) from {key: profiler event}: each the sum of `attr` (count, or a
    time) over the events of that kind."""
    def total(prefix):
        return sum(getattr(e, attr) for key, e in events.items() if key.startswith(prefix))
    return total("Torch-Compiled Region"), total("TorchDynamo Cache Lookup")
