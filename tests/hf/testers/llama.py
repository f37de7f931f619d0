"""opgym's model test for Llama (tests/models/llama/test_modeling_llama.py of the run tree; see
tests/hf/testers/causal_lm.py for what the tester builds and why)."""
import unittest

from transformers import (LlamaConfig, LlamaForCausalLM, LlamaForQuestionAnswering, LlamaForSequenceClassification,
                          LlamaForTokenClassification, LlamaModel)

from ...opgym_causal_lm_tester import CausalLMTest, CausalLMTester


class LlamaModelTester(CausalLMTester):
    config_class = LlamaConfig
    base_model_class = LlamaModel
    causal_lm_class = LlamaForCausalLM
    sequence_classification_class = LlamaForSequenceClassification
    token_classification_class = LlamaForTokenClassification
    question_answering_class = LlamaForQuestionAnswering


class LlamaModelTest(CausalLMTest, unittest.TestCase):
    model_tester_class = LlamaModelTester
    config_tester_kwargs = {"hidden_size": 64}  # LlamaConfig checks hidden_size % num_attention_heads (32)
