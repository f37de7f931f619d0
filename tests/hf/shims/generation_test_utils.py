"""Stands in for transformers' tests/generation/test_utils.py (GenerationTesterMixin), which the
5.23.0 source distribution does not ship (see tests/hf/fetch.py). opgym's own generation tests, in
the spirit of HF's: each decoding strategy and cache kind that `generate` has, checked on the model
tester's config and inputs against an invariant of HF's own code (a cache gives the no-cache tokens,
assisted and prompt-lookup decoding give greedy's tokens, a continued generation gives the one-shot
tokens, a static cache gives the dynamic cache's tokens, a seeded sample repeats, ...). Every test
runs for every generative class of the model (`all_generative_model_classes`).

The driver runs the suite once without and once with opgym patched into every model built; a test
here that passes without opgym and fails with it is a difference opgym must fix.
"""
from __future__ import annotations

import copy

import pytest
import torch

from transformers import DynamicCache, StaticCache
from transformers.testing_utils import torch_device

MAX_NEW = 4


class GenerationTesterMixin:
    model_tester = None
    max_new_tokens = MAX_NEW
    # keys of the tester's inputs that stay with generate (text models: input_ids and attention_mask)
    generate_extra_keys: tuple = ()

    # ---- helpers ------------------------------------------------------------------------------

    def prepare_config_and_inputs_for_generate(self, batch_size=2):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        keep = ("input_ids", "attention_mask", *self.generate_extra_keys)
        out = {}
        for k in keep:
            v = inputs.get(k)
            if v is None:
                continue
            out[k] = v[:batch_size] if k in ("input_ids", "attention_mask") else v
        if "attention_mask" in out:  # generation pads on the left: a full mask (HF's testers mask a triangle)
            out["attention_mask"] = torch.ones_like(out["attention_mask"])
        return config, self._trim_extra(out, batch_size)

    def _trim_extra(self, inputs, batch_size):
        """Multimodal testers trim their own extra inputs to batch_size (see qwen2_5_vl)."""
        trim = getattr(self.model_tester, "trim_generate_inputs", None)
        return trim(inputs, batch_size) if trim is not None else inputs

    def _model(self, model_class, config, **kw):
        for k, v in kw.items():
            setattr(config, k, v)
        torch.manual_seed(0)
        return model_class(config).to(torch_device).eval()

    def _gen(self, model, inputs, **kw):
        pad = getattr(model.config.get_text_config(), "pad_token_id", None)
        args = dict(max_new_tokens=self.max_new_tokens, min_new_tokens=self.max_new_tokens, do_sample=False,
                    pad_token_id=pad if pad is not None else 0)
        suppress = getattr(self.model_tester, "suppress_tokens", None)  # e.g. image tokens: never generated
        if suppress:
            args["suppress_tokens"] = list(suppress)
        args.update(kw)
        with torch.no_grad():
            return model.generate(**inputs, **args)

    def _classes(self):
        classes = [c for c in self.all_generative_model_classes]
        if not classes:
            self.skipTest("no generative model class")
        return classes

    @staticmethod
    def _seqs(out):
        return out.sequences if hasattr(out, "sequences") else out

    # ---- decoding strategies ------------------------------------------------------------------

    @pytest.mark.generate
    def test_greedy_generate(self):
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            out = self._gen(model, inputs)
            self.assertEqual(out.shape, (inputs["input_ids"].shape[0], inputs["input_ids"].shape[1] + MAX_NEW))

    @pytest.mark.generate
    def test_greedy_generate_dict_outputs_use_cache(self):
        """With a cache and without, greedy picks the same tokens, each the argmax of its step's scores."""
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            a = self._gen(model, inputs, use_cache=True, return_dict_in_generate=True, output_scores=True,
                          output_logits=True)
            b = self._gen(model, inputs, use_cache=False, return_dict_in_generate=True, output_scores=True)
            self.assertTrue(torch.equal(a.sequences, b.sequences))
            self.assertEqual(len(a.scores), MAX_NEW)
            self.assertIsNotNone(a.past_key_values)
            new = a.sequences[:, -MAX_NEW:]
            self.assertEqual(len(a.logits), MAX_NEW)
            for step, scores in enumerate(a.scores):  # the processed scores' argmax is the token picked
                self.assertTrue(torch.equal(scores.argmax(-1), new[:, step]))

    @pytest.mark.generate
    def test_greedy_generate_attentions_and_hidden_states(self):
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            config._attn_implementation = "eager"
            model = self._model(cls, config)
            out = self._gen(model, inputs, return_dict_in_generate=True, output_attentions=True,
                            output_hidden_states=True)
            self.assertEqual(len(out.hidden_states), MAX_NEW)
            self.assertEqual(len(out.attentions), MAX_NEW)
            n_layers = self.model_tester.num_hidden_layers
            self.assertEqual(len(out.hidden_states[0]), n_layers + 1)
            self.assertEqual(len(out.attentions[0]), n_layers)

    @pytest.mark.generate
    def test_sample_generate(self):
        """A seeded sample repeats itself."""
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            outs = []
            for _ in range(2):
                torch.manual_seed(7)
                outs.append(self._gen(model, inputs, do_sample=True, top_k=10, temperature=0.9))
            self.assertTrue(torch.equal(outs[0], outs[1]))

    @pytest.mark.generate
    def test_beam_search_generate(self):
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            out = self._gen(model, inputs, num_beams=3, num_return_sequences=2, return_dict_in_generate=True,
                            output_scores=True)
            b, L = inputs["input_ids"].shape
            self.assertEqual(out.sequences.shape, (2 * b, L + MAX_NEW))
            self.assertEqual(out.sequences_scores.shape, (2 * b,))
            # the best beam of 3 with one returned is the first of the two returned
            one = self._gen(model, inputs, num_beams=3)
            self.assertTrue(torch.equal(one, out.sequences[::2]))

    @pytest.mark.generate
    def test_beam_sample_generate(self):
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            outs = []
            for _ in range(2):
                torch.manual_seed(3)
                outs.append(self._gen(model, inputs, num_beams=2, do_sample=True))
            self.assertTrue(torch.equal(outs[0], outs[1]))

    @pytest.mark.generate
    def test_assisted_decoding_matches_greedy_search(self):
        """The model assisting itself gives greedy's tokens (batch of 1: assisted decoding's limit)."""
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate(batch_size=1)
            model = self._model(cls, config)
            greedy = self._gen(model, inputs, return_dict_in_generate=True, output_scores=True)
            assistant = copy.deepcopy(model)
            assistant.generation_config.num_assistant_tokens = 2
            assisted = self._gen(model, inputs, assistant_model=assistant, return_dict_in_generate=True,
                                 output_scores=True)
            self.assertTrue(torch.equal(greedy.sequences, assisted.sequences))

    @pytest.mark.generate
    def test_prompt_lookup_decoding_matches_greedy_search(self):
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate(batch_size=1)
            model = self._model(cls, config)
            greedy = self._gen(model, inputs)
            lookup = self._gen(model, inputs, prompt_lookup_num_tokens=2, max_matching_ngram_size=1)
            self.assertTrue(torch.equal(greedy, lookup))

    # ---- caches and inputs --------------------------------------------------------------------

    @pytest.mark.generate
    def test_generate_continue_from_past_key_values(self):
        """Generating N then N more from the returned cache gives the 2N tokens of one call."""
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            full = self._gen(model, inputs, max_new_tokens=2 * MAX_NEW, min_new_tokens=2 * MAX_NEW)
            first = self._gen(model, inputs, return_dict_in_generate=True)
            more = dict(inputs)
            more["input_ids"] = first.sequences
            if "attention_mask" in more:
                more["attention_mask"] = torch.ones_like(first.sequences)
            more.pop("pixel_values", None)  # the image is in the cache already (its rope deltas kept by the model)
            more.pop("image_grid_thw", None)
            if "mm_token_type_ids" in more:  # the generated tokens are text
                t = more["mm_token_type_ids"]
                more["mm_token_type_ids"] = torch.cat([t, t.new_zeros(t.shape[0], MAX_NEW)], 1)
            second = self._gen(model, more, past_key_values=first.past_key_values)
            self.assertTrue(torch.equal(full, second))

    @pytest.mark.generate
    def test_generate_with_static_cache(self):
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            dyn = self._gen(model, inputs, return_dict_in_generate=True)
            self.assertIsInstance(dyn.past_key_values, DynamicCache)
            static = self._gen(model, inputs, cache_implementation="static", return_dict_in_generate=True)
            self.assertIsInstance(static.past_key_values, StaticCache)
            self.assertTrue(torch.equal(dyn.sequences, static.sequences))

    @pytest.mark.generate
    def test_left_padding_compatibility(self):
        """The last token's logits with left padding (and its position ids) equal those without."""
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            if set(inputs) - {"input_ids", "attention_mask"}:
                self.skipTest("multimodal inputs: positions depend on the image grid")
            model = self._model(cls, config)
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            with torch.no_grad():
                plain = model(input_ids=ids, attention_mask=mask).logits[:, -1]
                pad = torch.full((ids.shape[0], 3), model.config.pad_token_id or 0, dtype=ids.dtype, device=ids.device)
                pids = torch.cat([pad, ids], 1)
                pmask = torch.cat([torch.zeros_like(pad), mask], 1)
                pos = (pmask.long().cumsum(-1) - 1).clamp(min=0)
                padded = model(input_ids=pids, attention_mask=pmask, position_ids=pos).logits[:, -1]
            torch.testing.assert_close(plain, padded, rtol=1e-5, atol=1e-5)

    @pytest.mark.generate
    def test_generate_from_inputs_embeds(self):
        """From inputs_embeds (the model's own embeddings of the ids) greedy picks the same new tokens."""
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            if set(inputs) - {"input_ids", "attention_mask"}:
                self.skipTest("multimodal inputs are merged into the embeddings inside the model")
            model = self._model(cls, config)
            ids = inputs["input_ids"]
            from_ids = self._gen(model, inputs)
            embeds = model.get_input_embeddings()(ids)
            from_embeds = self._gen(model, {"inputs_embeds": embeds, "attention_mask": inputs["attention_mask"]})
            self.assertTrue(torch.equal(from_ids[:, ids.shape[1]:], from_embeds))

    @pytest.mark.generate
    def test_past_key_values_format(self):
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            with torch.no_grad():
                out = model(**inputs, use_cache=True)
            cache = out.past_key_values
            self.assertIsInstance(cache, DynamicCache)
            self.assertEqual(len(cache.layers), self.model_tester.num_hidden_layers)
            b, L = inputs["input_ids"].shape
            self.assertEqual(cache.get_seq_length(), L)
            k = cache.layers[0].keys
            self.assertEqual(k.shape[0], b)
            self.assertEqual(k.shape[-2], L)

    @pytest.mark.generate
    def test_generate_after_dtype_move(self):
        """bf16 greedy after model.to(bfloat16) equals greedy of a model built in bf16 from the same weights."""
        for cls in self._classes():
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
            model.to(torch.bfloat16)
            moved = self._gen(model, inputs)
            fresh = self._model(cls, copy.deepcopy(config)).to(torch.bfloat16)
            fresh.load_state_dict(sd)
            self.assertTrue(torch.equal(moved, self._gen(fresh, inputs)))

    @pytest.mark.generate
    @pytest.mark.torch_compile_test
    def test_generate_compile_model_forward(self):
        """generate with a compiled forward (static cache) gives the eager tokens."""
        for cls in self._classes()[:1]:
            config, inputs = self.prepare_config_and_inputs_for_generate()
            model = self._model(cls, config)
            eager = self._gen(model, inputs, cache_implementation="static")
            torch._dynamo.reset()
            model.forward = torch.compile(model.forward, fullgraph=False)
            compiled = self._gen(model, inputs, cache_implementation="static")
            del model.forward
            self.assertTrue(torch.equal(eager, compiled))
