"""opgym's model test for Qwen2.5-VL (tests/models/qwen2_5_vl/test_modeling_qwen2_5_vl.py of the run
tree; the 5.23.0 sdist does not ship HF's). A small text model (2 layers, hidden 32, SiLU MLP, MRoPE
sections 2/3/3 of head dim 16) and vision tower (2 blocks, hidden 32, one full-attention block, one
windowed), every sample one 4x4-patch image (4 merged tokens) between vision start/end tokens."""
import unittest

import torch

from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLModel

from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor, torch_device
from ...generation.test_utils import GenerationTesterMixin

IMAGE, VIDEO, V_START, V_END = 3, 4, 5, 6  # low ids: they survive the vocab shrink of the resize tests
GRID = (1, 4, 4)  # t, h, w patches per image; 16 patches, 4 tokens after the 2x2 merge


class Qwen2_5_VLModelTester:
    suppress_tokens = (IMAGE, VIDEO, V_START, V_END)  # a generated image token would need image features
    def __init__(self, parent, batch_size=3, text_tokens=7, is_training=True):
        self.parent, self.batch_size, self.is_training = parent, batch_size, is_training
        self.vocab_size, self.hidden_size, self.num_hidden_layers = 99, 32, 2
        self.num_attention_heads, self.num_key_value_heads, self.intermediate_size = 2, 2, 37
        self.patch_size, self.temporal_patch_size, self.in_channels = 14, 2, 3
        self.image_tokens = GRID[0] * GRID[1] * GRID[2] // 4
        self.seq_length = 2 + self.image_tokens + text_tokens
        self.num_labels, self.type_sequence_label_size = 3, 2
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2
        self.text_config = {
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "intermediate_size": 37,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_act": "silu",
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "pad_token_id": 0, "bos_token_id": 1,
            "eos_token_id": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                   "mrope_section": [2, 3, 3]},
        }
        self.vision_config = {
            "depth": 2, "hidden_size": 32, "intermediate_size": 38, "num_heads": 2, "hidden_act": "silu",
            "out_hidden_size": self.hidden_size, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "in_channels": 3, "window_size": 56, "fullatt_block_indexes": [1],
        }

    def get_config(self):
        return Qwen2_5_VLConfig(text_config=self.text_config, vision_config=self.vision_config,
                                image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=V_START,
                                vision_end_token_id=V_END)

    def _inputs(self, batch_size):
        text = self.seq_length - 2 - self.image_tokens
        ids = ids_tensor([batch_size, text], self.vocab_size - 7) + 7  # no special id among the text tokens
        head = torch.tensor([V_START] + [IMAGE] * self.image_tokens + [V_END], device=ids.device)
        input_ids = torch.cat([head.expand(batch_size, -1), ids], 1)
        patch_dim = self.in_channels * self.temporal_patch_size * self.patch_size ** 2
        n = GRID[0] * GRID[1] * GRID[2]
        pixel_values = floats_tensor([batch_size * n, patch_dim])
        grid = torch.tensor([GRID] * batch_size, device=torch_device)
        mm_types = (input_ids == IMAGE).int()  # text 0, image 1 (what the processor returns)
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                "pixel_values": pixel_values, "image_grid_thw": grid, "mm_token_type_ids": mm_types}

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), self._inputs(self.batch_size)

    def trim_generate_inputs(self, inputs, batch_size):
        n = GRID[0] * GRID[1] * GRID[2]
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"][: batch_size * n]
        if "image_grid_thw" in inputs:
            inputs["image_grid_thw"] = inputs["image_grid_thw"][:batch_size]
        if "mm_token_type_ids" in inputs:
            inputs["mm_token_type_ids"] = inputs["mm_token_type_ids"][:batch_size]
        return inputs


class Qwen2_5_VLModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (Qwen2_5_VLModel, Qwen2_5_VLForConditionalGeneration)
    generate_extra_keys = ("pixel_values", "image_grid_thw", "mm_token_type_ids")
    _is_composite = True
    test_pruning = False

    def setUp(self):
        self.model_tester = Qwen2_5_VLModelTester(self)
        self.config_tester = ConfigTester(self, config_class=Qwen2_5_VLConfig, has_text_modality=False)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_image_tokens_drive_the_vision_tower(self):
        """Changing the pixels changes the logits at the text tokens after the image (the tower is used)."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch_device).eval()
        with torch.no_grad():
            a = model(**inputs).logits[:, -1]
            inputs["pixel_values"] = inputs["pixel_values"] + 1.0
            b = model(**inputs).logits[:, -1]
        self.assertFalse(torch.equal(a, b))
