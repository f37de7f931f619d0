"""Stands in for transformers' tests/utils/test_configuration_utils.py, which the 5.23.0 source
distribution does not ship (opgym's own file, see tests/hf/fetch.py): `config_common_kwargs`, the
keyword arguments ConfigTester.check_config_arguments_init passes to a config and reads back.
Only attributes every PreTrainedConfig of 5.23 keeps as given (checked by that very test)."""

config_common_kwargs = {
    "output_hidden_states": True,
    "output_attentions": True,
    "return_dict": False,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
    "tie_word_embeddings": False,
    "is_encoder_decoder": False,
}
