"""opgym's model test for Mistral (tests/models/mistral/test_modeling_mistral.py of the run tree; see
tests/hf/testers/causal_lm.py for what the tester builds and why)."""
import unittest

from transformers import (MistralConfig, MistralForCausalLM, MistralForQuestionAnswering, MistralForSequenceClassification,
                          MistralForTokenClassification, MistralModel)

from ...opgym_causal_lm_tester import CausalLMTest, CausalLMTester


class MistralModelTester(CausalLMTester):
    config_class = MistralConfig
    base_model_class = MistralModel
    causal_lm_class = MistralForCausalLM
    sequence_classification_class = MistralForSequenceClassification
    token_classification_class = MistralForTokenClassification
    question_answering_class = MistralForQuestionAnswering


class MistralModelTest(CausalLMTest, unittest.TestCase):
    model_tester_class = MistralModelTester
