"""opgym's model test for Qwen2 (tests/models/qwen2/test_modeling_qwen2.py of the run tree; see
tests/hf/testers/causal_lm.py for what the tester builds and why)."""
import unittest

from transformers import (Qwen2Config, Qwen2ForCausalLM, Qwen2ForQuestionAnswering, Qwen2ForSequenceClassification,
                          Qwen2ForTokenClassification, Qwen2Model)

from ...opgym_causal_lm_tester import CausalLMTest, CausalLMTester


class Qwen2ModelTester(CausalLMTester):
    config_class = Qwen2Config
    base_model_class = Qwen2Model
    causal_lm_class = Qwen2ForCausalLM
    sequence_classification_class = Qwen2ForSequenceClassification
    token_classification_class = Qwen2ForTokenClassification
    question_answering_class = Qwen2ForQuestionAnswering


class Qwen2ModelTest(CausalLMTest, unittest.TestCase):
    model_tester_class = Qwen2ModelTester
