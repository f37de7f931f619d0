"""Why is opgym inside torch.compile slower than HF compiled? (issue 25, phase 1, item 3)

1. torch._dynamo.explain of the prefill forward, HF alone and opgym-patched: graphs, graph breaks, reasons.
2. The graph AOTAutograd hands to inductor (captured by a backend that does not compile): which
   opgym ops it contains, and the functionalization copies around in-place custom ops
   (auto_functionalized, copy_, clone), HF alone vs opgym.

    PYTHONPATH=python python docs/research/issue25_perf/compile_probe.py [--attn eager|sdpa]
"""
import argparse
import collections

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--attn", default="eager")
    a = p.parse_args()
    import opgym
    from opgym import models as M
    cfg = M.qwen2_5_vl_3b_config(text_layers=4, vision_blocks=4)
    model = M.build_model(cfg, attn_implementation=a.attn)
    inputs = M.make_inputs(cfg, image=M.synthetic_page(448, 448))
    kw = dict(inputs, use_cache=True, logits_to_keep=1)

    with torch.inference_mode():
        for side in ("hf", "opgym"):
            h = opgym.patch(model) if side == "opgym" else None
            try:
                torch._dynamo.reset()
                ex = torch._dynamo.explain(model.forward)(**kw)
                print(f"== {side}: graphs {ex.graph_count}, graph breaks {ex.graph_break_count}, "
                      f"ops in graphs {ex.op_count}")
                for br in ex.break_reasons[:20]:
                    where = br.user_stack[-1] if br.user_stack else None
                    print(f"   break: {br.reason[:160]!s} @ {where.filename.split('/')[-1] + ':' + str(where.lineno) if where else '?'}")

                graphs = []

                def capture(gm, example_inputs):
                    from torch._functorch.aot_autograd import aot_module_simplified

                    def fw(g, _ins):
                        graphs.append(g)
                        return g.forward
                    return aot_module_simplified(gm, example_inputs, fw_compiler=fw)
                torch._dynamo.reset()
                torch.compile(model.forward, backend=capture, dynamic=True)(**kw)
                c = collections.Counter()
                for g in graphs:
                    for n in g.graph.nodes:
                        if n.op == "call_function":
                            t = str(n.target)
                            if "opgym" in t or "auto_functionalized" in t or t in ("aten.copy_.default", "aten.clone.default", "aten.copy.default"):
                                key = t
                                if "auto_functionalized" in t:
                                    key = f"{t}({n.args[0]})"
                                c[key] += 1
                print(f"   aot graphs: {len(graphs)}; nodes of interest:")
                for k, v in sorted(c.items()):
                    print(f"     {v:5d}  {k}")
            finally:
                if h is not None:
                    h.undo()


if __name__ == "__main__":
    main()
