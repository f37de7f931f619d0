"""opgym's tester for decoder-only text models (Qwen2, Llama, Qwen3, Mistral), in the shape of HF's
model tests: a ModelTester that builds a small config and inputs, and a test class mixing the
sdist's ModelTesterMixin (tests/test_modeling_common.py) with GenerationTesterMixin. Copied by
tests/hf/fetch.py to tests/opgym_causal_lm_tester.py of the run tree (the 5.23.0 sdist does not ship
HF's own tests/causal_lm_tester.py nor the per-model test files).

The config is the small one HF's tests use (2 layers, hidden 32, 2 heads, vocab 99, intermediate 37)
with one deliberate choice: hidden_act="silu", every one of these families' real activation, so that
opgym's SwiGLU integration serves the MLPs (a GELU MLP is left alone by opgym and would test nothing).
"""
from __future__ import annotations

from inspect import signature

import torch

from .test_configuration_common import ConfigTester
from .test_modeling_common import ModelTesterMixin, ids_tensor, torch_device
from .generation.test_utils import GenerationTesterMixin
from .test_training_mixin import TrainingTesterMixin


class CausalLMTester:
    config_class = None
    base_model_class = None
    causal_lm_class = None
    sequence_classification_class = None
    token_classification_class = None
    question_answering_class = None
    extra_config: dict = {}

    def __init__(self, parent, batch_size=13, seq_length=7, is_training=True, use_input_mask=True,
                 use_labels=True, vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, intermediate_size=37, hidden_act="silu", max_position_embeddings=512,
                 type_sequence_label_size=2, initializer_range=0.02, num_labels=3, num_choices=4,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2):
        self.parent = parent
        self.batch_size, self.seq_length = batch_size, seq_length
        self.is_training, self.use_input_mask, self.use_labels = is_training, use_input_mask, use_labels
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads, self.intermediate_size = num_key_value_heads, intermediate_size
        self.hidden_act, self.max_position_embeddings = hidden_act, max_position_embeddings
        self.type_sequence_label_size, self.initializer_range = type_sequence_label_size, initializer_range
        self.num_labels, self.num_choices = num_labels, num_choices
        self.pad_token_id, self.bos_token_id, self.eos_token_id = pad_token_id, bos_token_id, eos_token_id
        self.head_dim = hidden_size // num_attention_heads

    @property
    def all_model_classes(self):
        return tuple(c for c in (self.base_model_class, self.causal_lm_class, self.sequence_classification_class,
                                 self.token_classification_class, self.question_answering_class) if c is not None)

    def get_config(self):
        names = set(signature(self.config_class.__init__).parameters) | {"pad_token_id"}
        kwargs = {k: getattr(self, k) for k in names if k != "self" and hasattr(self, k)}
        kwargs.update(self.extra_config)
        return self.config_class(**kwargs)

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        mask = torch.tril(torch.ones_like(input_ids).to(torch_device)) if self.use_input_mask else None
        seq_labels = ids_tensor([self.batch_size], self.type_sequence_label_size) if self.use_labels else None
        tok_labels = ids_tensor([self.batch_size, self.seq_length], self.num_labels) if self.use_labels else None
        return self.get_config(), input_ids, mask, seq_labels, tok_labels

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, mask, _, _ = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": mask}


class CausalLMTest(ModelTesterMixin, GenerationTesterMixin, TrainingTesterMixin):
    """Mixed into a unittest.TestCase by each model's module (model_tester_class set there).
    TrainingTesterMixin (the sdist's): 300 steps overfitting a batch, then greedy generation of it."""
    model_tester = None  # set in setUp (TrainingTesterMixin declares it abstract)
    model_tester_class = None
    test_pruning = False
    config_tester_kwargs = {"hidden_size": 37}

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = ConfigTester(self, config_class=self.model_tester.config_class,
                                          **self.config_tester_kwargs)
        self.all_model_classes = self.model_tester.all_model_classes

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model(self):
        config, input_ids, mask, _, _ = self.model_tester.prepare_config_and_inputs()
        model = self.model_tester.base_model_class(config).to(torch_device).eval()
        out = model(input_ids, attention_mask=mask)
        t = self.model_tester
        self.assertEqual(out.last_hidden_state.shape, (t.batch_size, t.seq_length, t.hidden_size))

    def _head(self, cls, labels, problem_type=None):
        if cls is None:
            self.skipTest("no such head for this model")
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        config.num_labels = 3
        if problem_type:
            config.problem_type = problem_type
        model = cls(config).to(torch_device).eval()
        out = model(inputs["input_ids"], attention_mask=inputs["input_ids"].ne(1).to(torch_device), labels=labels)
        self.assertTrue(torch.isfinite(out.loss).all())
        return out

    def test_sequence_classification_model(self):
        t = self.model_tester
        out = self._head(t.sequence_classification_class, ids_tensor([t.batch_size], t.type_sequence_label_size))
        self.assertEqual(out.logits.shape, (t.batch_size, 3))

    def test_sequence_classification_model_for_multi_label(self):
        t = self.model_tester
        labels = ids_tensor([t.batch_size, 3], t.type_sequence_label_size).to(torch.float)
        out = self._head(t.sequence_classification_class, labels, "multi_label_classification")
        self.assertEqual(out.logits.shape, (t.batch_size, 3))

    def test_token_classification_model(self):
        t = self.model_tester
        out = self._head(t.token_classification_class, ids_tensor([t.batch_size, t.seq_length], 3))
        self.assertEqual(out.logits.shape, (t.batch_size, t.seq_length, 3))

    def test_causal_lm_loss_matches_manual(self):
        """The LM head's loss equals the shifted cross-entropy of its own logits."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        model = self.model_tester.causal_lm_class(config).to(torch_device).eval()
        with torch.no_grad():
            out = model(**inputs, labels=inputs["input_ids"])
        logits, ids = out.logits[:, :-1].float(), inputs["input_ids"][:, 1:]
        want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))
        torch.testing.assert_close(out.loss, want)
