"""opgym's model test for Qwen3 (tests/models/qwen3/test_modeling_qwen3.py of the run tree; see
tests/hf/testers/causal_lm.py for what the tester builds and why)."""
import unittest

from transformers import (Qwen3Config, Qwen3ForCausalLM, Qwen3ForQuestionAnswering, Qwen3ForSequenceClassification,
                          Qwen3ForTokenClassification, Qwen3Model)

from ...opgym_causal_lm_tester import CausalLMTest, CausalLMTester


class Qwen3ModelTester(CausalLMTester):
    config_class = Qwen3Config
    base_model_class = Qwen3Model
    causal_lm_class = Qwen3ForCausalLM
    sequence_classification_class = Qwen3ForSequenceClassification
    token_classification_class = Qwen3ForTokenClassification
    question_answering_class = Qwen3ForQuestionAnswering


class Qwen3ModelTest(CausalLMTest, unittest.TestCase):
    model_tester_class = Qwen3ModelTester
