"""The exact graph path: `opgym.compile(model)`, and the torch.compile backend "opgym".

Dynamo captures the model's forward as FX graphs; each op's patterns (ops/<op>/patterns.py) find, in those
graphs, the sequences of torch calls the op computes - by what they compute (the ops, their arguments, dtype
casts, reduction dims), never by a class name, module path or source text - and each candidate is admitted
by bits: the region, cut out of the graph, is run against the op on the op's probe inputs, and replaced only
when the op gives its bits. Every other node runs as captured, eagerly (no inductor): HF eager's bits. So a
transformers release that renames a keyword or adds a decorator changes nothing here.

A replaced region is a guarded call: the op, or - when its switch is off, a gradient is needed, or the op
raises - the region's own captured code (counted with the reason). The model never raises because of opgym.

On CUDA, `opgym.compile(model, cuda_graphs=True)` captures each rewritten graph as a CUDA graph per input
signature and replays it (cuda_graphs.py: the same kernels, so the same bits; unverified until a GPU runs it).
"""
from .backend import GraphHandle, backend, compile  # noqa: F401
