"""The layer forms add_rms_norm serves, and the ones it leaves alone with what they are (transformers 5.23).

A form is a layer forward's statement fingerprint (guard.fingerprint, the key) and where its residual
add meets an RMSNorm of the sum:
- `fuse`: the norm applied to a residual sum right after the add (the two are one call of the op);
- `chain_in`: the norm of the layer's input (its first argument), which may come from the previous
  layer's stash; `chain_out`: the layer's last statement before `return` is a residual add, whose sum
  the next layer's `chain_in` norms (the two are one call when both layers are fused neighbours).
The fused forward is HF's own AST with only those statements replaced (rewrite.py); a norm named here
is used only if it is an RMSNorm the admission probe admits (rms_norm/admission.py), in the variant
found (Llama rounding, one fp32 rounding, Gemma's 1 + weight). Each form is proven by a test on a
tiny model of a type that uses it: logits bit-identical to HF eager in bf16, fp16 and fp32
(tests/test_add_rms_norm_forms.py).

`SKIPS`: forms with RMSNorms in which no residual add is followed by an RMSNorm of its sum, or where
one is but opgym does not fuse it, with the reason `handle.skipped` gives. A form in neither table is
"not one opgym has verified". `opgym coverage --catalog FILE` writes every form HF has (decoder layers).
"""
from __future__ import annotations

from dataclasses import dataclass

_PRE = "input_layernorm"  # the usual pre-attention norm


@dataclass(frozen=True)
class Form:
    fingerprint: str
    fuse: str  # the norm of the residual sum
    chain_in: str | None = _PRE
    chain_out: bool = True
    where: str = ""  # the classes (model types) whose forward this is


def _forms(*forms: Form) -> dict[str, Form]:
    return {f.fingerprint: f for f in forms}


FORMS = _forms(
    # Llama/Qwen2/Qwen3/Mistral/DeepSeek/... pre-norm body: residual + attn, post_attention_layernorm
    Form("40dc1b2a48a8e879", "post_attention_layernorm", where="LlamaDecoderLayer, Qwen2/Qwen2_5_VL/Qwen3/"
         "Mistral/Gemma/DeepseekV3/... DecoderLayer (85 types)"),
    # vision block: h = h + attn(norm1(h)); h = h + mlp(norm2(h)) (not chained: blocks add and norm on their own)
    Form("98e4e51c7b3e5699", "norm2", chain_in=None, chain_out=False,
         where="Qwen2_5_VLVisionBlock, Qwen2VL/Qwen3VL/Glm4v/... VisionBlock (22 types)"),
    # Gemma-2/3: post_attention_layernorm(attn), residual add, pre_feedforward_layernorm of the sum
    Form("58992c959a10c349", "pre_feedforward_layernorm", where="Gemma2/Gemma3DecoderLayer"),
    Form("4cf005f3ee8efded", "pre_feedforward_layernorm", where="Gemma4VisionEncoderLayer"),
    # Gemma-4 text: ends with `hidden_states *= self.layer_scalar` (and per-layer inputs): no chain
    Form("7b7ea99e01e11082", "pre_feedforward_layernorm", chain_in=None, chain_out=False,
         where="Gemma4TextDecoderLayer"),
    Form("f9d74b6727e96508", "pre_feedforward_layernorm", chain_in=None, chain_out=False,
         where="Gemma4UnifiedTextDecoderLayer"),
    Form("1df5c072dda7c529", "pre_feedforward_layernorm", where="VaultGemmaDecoderLayer"),
    # GLM-4 family: extra post_self_attn / post_mlp norms before the adds
    Form("329363f35b7a3559", "post_attention_layernorm", where="Glm4/Kolibri1DecoderLayer"),
    Form("5a4782cac9094160", "post_attention_layernorm", where="Glm4vText/GlmOcrTextDecoderLayer"),
    Form("460baa0a2349f9e2", "pre_mlp_layernorm", where="AfmoeDecoderLayer"),
    # scaled residuals: residual + h * self.residual_multiplier (the product in torch, then the op)
    Form("e3324e1ae067c63e", "post_attention_layernorm", where="Granite/GraniteSWA/GraniteDoclingTextDecoderLayer"),
    Form("2bca5d3e3d08585c", "post_attention_layernorm", where="GraniteMoeSWA/GraniteMoeSharedDecoderLayer"),
    Form("a1e55372200c3a58", "post_attention_layernorm", where="GraniteMoeDecoderLayer"),
    Form("0ec9bd32ceab1c8e", "post_attention_layernorm", where="GraniteMoeHybridDecoderLayer"),
    Form("2f567dbf23ad85dd", "post_attention_layernorm", where="HyperCLOVAXDecoderLayer (post_norm1/2 too)"),
    Form("132401daffee5b9a", "post_attention_layernorm", where="MiniCPM3DecoderLayer (residual_scale)"),
    Form("3a59713c11070e3d", "post_attention_layernorm", where="DogeDecoderLayer (input_residual * residual + h)"),
    Form("7eaa032b98fdb581", "post_attention_layernorm", where="MllamaCrossAttentionDecoderLayer (tanh gates)"),
    # Llama-like bodies written differently (argument order, MoE/hybrid mixers, dropouts, tuples)
    Form("fad010302f0a1550", "post_attention_layernorm", where="Mixtral/MiniMaxM2/MiniMaxM3VL/PhimoeDecoderLayer"),
    Form("2c6a24af9f2b7236", "post_attention_layernorm", where="Qwen3_5DecoderLayer (linear/full attention)"),
    Form("0a5dffe5a8d69f82", "post_attention_layernorm", where="Qwen3Next/Qwen3_5MoeDecoderLayer"),
    Form("d19ad40a864c7926", "post_attention_layernorm", where="Qwen3VLTextDecoderLayer"),
    Form("42a885194ceb913d", "post_attention_layernorm", where="BailingHybrid/KimiLinearDecoderLayer"),
    Form("28e51eb4cad15ea1", "post_attention_layernorm", where="MllamaSelfAttentionDecoderLayer, BltTransformerLayer"),
    Form("125d4a163c8659c2", "post_attention_layernorm", where="Phi3/Phi4MultimodalDecoderLayer, Dots3NoteAudioLayer"),
    Form("9b5f92b2d1769d0b", "post_attention_layernorm", where="Llama4TextDecoderLayer"),
    Form("0de74faf27f4a71a", "post_attention_layernorm", where="MistralLarge4TextDecoderLayer"),
    Form("af0b3b528a5f3981", "post_attention_layernorm", where="Ernie4_5_VLMoeDecoderLayer (h + residual)"),
    Form("449eb0b346e1a3e4", "post_attention_layernorm", where="GlmMoeDsaDecoderLayer"),
    Form("c6deac42f9c8aa04", "post_attention_layernorm", where="GptOssDecoderLayer"),
    Form("7893e080bf261fad", "post_attention_layernorm", where="JetMoeDecoderLayer"),
    Form("5656187f8536572b", "post_attention_layernorm", where="MoshiDecoderLayer"),
    Form("8577ed7d79d85c0e", "post_attention_layernorm", where="OlmoHybridLinearAttentionDecoderLayer"),
    # evolla: an optional adapter after the MLP add: no chain out (and so none in)
    Form("c8ed74090d3fb240", "post_attention_layernorm", chain_in=None, chain_out=False, where="EvollaDecoderLayer"),
    Form("23ed6a3d30307ae0", "feedforward_layernorm", chain_in="attention_layernorm", where="ApertusDecoderLayer"),
    Form("1c674e3ce1cfc702", "pre_ff_layernorm", where="BambaDecoderLayer"),
    Form("697b0e256fe0dfb8", "pre_ff_layernorm", where="FalconH1DecoderLayer"),
    Form("9e79480fa58caa45", "pre_ff_layernorm", where="JambaMambaDecoderLayer"),
    Form("05940a6780735b3c", "pre_ff_layernorm", where="JambaAttentionDecoderLayer"),
    Form("118b2271774d7c14", "post_attention_layernorm", chain_in="input_latents_norm", where="Idefics2PerceiverLayer"),
    Form("805793e3ab258f6e", "ffn_norm", chain_in="attention_norm", where="PixtralAttentionLayer"),
    # h = h + residual; h = h + feed_forward(ffn_norm(h))
    Form("d0d122b1438f7c2c", "ffn_norm", chain_in="operator_norm",
         where="Lfm2/Lfm2Moe DecoderLayer, Lfm3VlVisionLayer"),
    Form("e68b83153fbdea73", "ffn_norm", chain_in="operator_norm", where="Lfm3DecoderLayer"),
    # the norm's output under another name: h = h + attn; n = rms_norm2(h)
    Form("1fbb7fc977cd3213", "rms_norm2", chain_in="rms_norm1", where="Ovis2VisionEncoderLayer"),
    Form("490352e976f9d7bd", "channel_pre_norm", chain_in=None, chain_out=False,
         where="RecurrentGemmaDecoderLayer (its input norm is of an alias: not chained)"),
    # T5Gemma-2 encoder and decoder layers: residual + dropout(post_self_attn_layernorm(attn))
    Form("2ddaa83f9916b0ec", "pre_feedforward_layernorm", chain_in="pre_self_attn_layernorm",
         where="T5Gemma2EncoderLayer"),
    Form("b86fd9924e0ed290", "pre_feedforward_layernorm", chain_in="pre_self_attn_layernorm",
         where="T5Gemma2DecoderLayer"),
    # IDEFICS: decoder and gated cross-attention layers sit in two lists the model interleaves, so
    # neither list's neighbours see each other's sums: not chained
    Form("025d9421b3272741", "post_attention_layernorm", chain_in=None, chain_out=False, where="IdeficsDecoderLayer"),
    Form("c42b7109deb7b1b3", "post_attention_layernorm", chain_in=None, chain_out=False,
         where="IdeficsGatedCrossAttentionLayer (tanh(alpha) * h)"),
    # post-norm of a scaled sum: h = residual * alpha + h * beta; h = norm(h); residual = h
    Form("79425af3ddbff87c", "post_attention_layernorm", where="MiniMaxDecoderLayer"),
)

_POST_NORM = ("post-norm layer: the RMSNorms are applied to the attention and MLP outputs before the residual "
              "add (residual + norm(h)); no add is followed by a norm of the sum")
_HYPER = ("hyper-connections: the residual stream is mixed by learned post/comb weights "
          "(post * h + comb @ residual), not a residual add; its norms are of the collapsed stream")

SKIPS = {
    "5960517daf44d47d": _POST_NORM,  # Olmo2/Olmo3/Exaone4/OlmoHybridAttention DecoderLayer
    "08b48087818368a1": _POST_NORM,  # FlexOlmoDecoderLayer
    "f5a73ac618501aba": _HYPER,  # DeepseekV4DecoderLayer
    "d799d7ee63321d80": _HYPER,  # Glm5NextTextDecoderLayer
    "60726a7b0c5effef": _HYPER + " (the sum in fp32)",  # HYV4DecoderLayer
    "0808663a48244263": ("residual adds through depth_scaled_residual_add(h, residual, idx) after the post-norms, "
                         "not a plain add"),  # BeamDecoderLayer
    "7ff7eafd6a7704a2": ("residual adds are gate modules (post_attention_residual_gate(residual, h)), not a plain "
                         "add; its input norms are centered RMSNorms"),  # MuseSparkTextDecoderLayer
    "c26c6ac069015b70": ("residual adds are scale modules (post_attention_residual_scale(h, residual)) and the "
                         "norms' inputs are cast to the weight dtype"),  # ZayaDecoderLayer
    "768c3085ec72aa21": ("the residual sum is taken in fp32 (block_residual.float() + h) and mixed with the block "
                         "states (mlp_input) before post_attention_layernorm: the norm is not of the sum"),
    "d465d14a89bcd7b6": ("the residual sum is taken in fp32 (block_residual.float() + h) and mixed with the block "
                         "states (mlp_input) before post_attention_layernorm: the norm is not of the sum"),
    "c5c3a8e0976d9b8d": ("where the norms sit depends on config.norm_after (an `if` between the add and the "
                         "norm): not a form opgym fuses"),  # Molmo2DecoderLayer
    "f3d76703f1a5787b": ("one residual add per block, at its end; the next norm is the next block's, of "
                         "hidden_states.to(norm.weight.dtype), with an optional fp32 residual"),  # Mamba/FalconMamba
    "4c99efcca83b86ef": ("one residual add per block, at its end; the next norm is the next block's, of "
                         "hidden_states.to(norm.weight.dtype), with an optional fp32 residual"),  # Mamba2Block
    "62a8f4ecbbf3f632": ("one residual add per block, at its end; the next norm is the next block's, of "
                         "hidden_states.to(norm.weight.dtype)"),  # NemotronHBlock
    "026ea409f32f7d31": ("the only add before the norm is conditional (h + transformer_hidden_states if given) "
                         "and is not the residual"),  # Zamba2MambaDecoderLayer
    "24730edf1d323f75": "the norm is of the conv output, and the residual add is the block's last statement",
    "11b8fc4b1fd5f628": ("the attention branch ends in a causal conv (attn_sconv) whose output's last dim is not "
                         "contiguous: the op would refuse every add (HF's sum keeps that layout)"),  # Inkling
    "fc4f8aa376df492a": "parallel attention and MLP from one LayerNorm: no add is followed by a norm",  # Cohere2
    "ccf75d3ea14378fd": "parallel attention and MLP from one LayerNorm: no add is followed by a norm",  # Cohere
    # a form with the fused shape that no tiny model runs (so no test proves it)
    "eae5f294ed51af78": "not verified by a run (the tiny xLSTM model of opgym coverage does not run)",  # xLSTMBlock
}
