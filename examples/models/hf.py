"""Hugging Face ``transformers`` models as their users have them, from tiny configs.

Each factory builds a model class of ``transformers`` from a config object
(random weights: nothing is downloaded, no network) and returns
``(model, example_inputs)`` where ``example_inputs`` is a dict of keyword
tensors: ``model(**example_inputs)`` returns the library's output object,
whose ``loss`` is the training loss (``labels`` are among the inputs). This is
the model exactly as a user has it, with no wrapper; :func:`autoshard.trace.trace_joint`
takes it as is.

Overrides are any field of the model's config class (``num_hidden_layers=1``,
``tie_word_embeddings=False``), ``attn_implementation`` / ``experts_implementation``,
or a build option of :class:`examples.models.factory.BuildOptions` (``batch_size``,
``seq_len``, ``device``, ``dtype``, ``seed``; ``dtype`` always means the
build option). The presets switch dropout off so that a traced step equals an
eager one, and ``use_cache`` off as in training.

``transformers`` is a test-only dependency (the ``dev`` extra); importing this
module does not need it, calling a factory does.

Factories: ``hf_llama``, ``hf_mistral``, ``hf_gpt2``, ``hf_bert`` (masked LM),
``hf_t5`` (encoder-decoder), ``hf_whisper`` (speech encoder-decoder),
``hf_falcon`` (Falcon's new decoder architecture), ``hf_qwen3``, ``hf_gemma3``
(sliding and full attention layers), the MoE models
``hf_mixtral``, ``hf_qwen3_moe`` and ``hf_deepseek_v3``, the state-space models
``hf_mamba`` and ``hf_mamba2`` (their slow path: plain torch ops, no CUDA kernels), and ``hf_llama3_8b``
(LLaMA-3-8B shapes on meta, to compare with ``llama3.llama3_8b``).

>>> model, inputs = hf_llama(device="meta")
>>> sorted(inputs), type(model).__name__
(['input_ids', 'labels'], 'LlamaForCausalLM')
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from examples.models.factory import BuildOptions, build_example, random_floats, random_tokens

__all__ = ["hf_llama", "hf_mistral", "hf_gpt2", "hf_bert", "hf_t5", "hf_whisper", "hf_falcon", "hf_qwen3",
           "hf_gemma3", "hf_mixtral", "hf_qwen3_moe", "hf_deepseek_v3", "hf_mamba", "hf_mamba2", "hf_llama3_8b"]

HFExample = tuple[nn.Module, dict[str, torch.Tensor]]
_IMPLEMENTATIONS = ("attn_implementation", "experts_implementation")
_OPTIONS = tuple(f.name for f in dataclasses.fields(BuildOptions))
_DECODER = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
            "use_cache": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_SEQUENCES = {"batch_size": 2, "seq_len": 16}


def hf_llama(**overrides: Any) -> HFExample:
    """``LlamaForCausalLM``: 2 layers, hidden 64, 4 query / 2 K/V heads, vocab 256, batch 2 x 16."""
    return _make("LlamaConfig", "LlamaForCausalLM", _DECODER, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_mistral(**overrides: Any) -> HFExample:
    """``MistralForCausalLM``, same shapes as :func:`hf_llama`, sliding window 8 (shorter than the sequence)."""
    preset = {**_DECODER, "sliding_window": 8}
    return _make("MistralConfig", "MistralForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_gpt2(**overrides: Any) -> HFExample:
    """``GPT2LMHeadModel`` (head tied to ``wte``): 2 layers, width 64, 4 heads, vocab 256, batch 2 x 16."""
    preset = {"vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "use_cache": False,
              "bos_token_id": 1, "eos_token_id": 2}
    return _make("GPT2Config", "GPT2LMHeadModel", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_bert(**overrides: Any) -> HFExample:
    """``BertForMaskedLM`` (decoder tied to the word embeddings): 2 layers, hidden 64, vocab 256, batch 2 x 16."""
    preset = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0, "pad_token_id": 0}
    return _make("BertConfig", "BertForMaskedLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_t5(**overrides: Any) -> HFExample:
    """``T5ForConditionalGeneration`` (``shared`` embedding of encoder, decoder and head): 2+2 layers, d_model 64."""
    preset = {"vocab_size": 256, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4,
              "dropout_rate": 0.0, "use_cache": False, "pad_token_id": 0, "eos_token_id": 1,
              "decoder_start_token_id": 0}
    return _make("T5Config", "T5ForConditionalGeneration", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_whisper(**overrides: Any) -> HFExample:
    """``WhisperForConditionalGeneration``: 2+2 layers, d_model 64, 16 mel bins, 32 audio frames, 16 labels.

    Inputs as a user trains it: ``input_features`` (batch, mel bins, frames)
    and ``labels``; the model shifts the labels into its decoder inputs (as
    :func:`hf_t5` does), which puts a tensor constant (the start token) in
    the traced graph.
    """
    preset = {"vocab_size": 256, "num_mel_bins": 16, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
              "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
              "decoder_ffn_dim": 128, "max_source_positions": 16, "max_target_positions": 64, "dropout": 0.0,
              "attention_dropout": 0.0, "activation_dropout": 0.0, "use_cache": False, "pad_token_id": 0,
              "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
    return _make("WhisperConfig", "WhisperForConditionalGeneration", preset, _SEQUENCES, overrides, _speech_inputs)


def hf_falcon(**overrides: Any) -> HFExample:
    """``FalconForCausalLM``, new decoder architecture (grouped K/V, parallel attention and MLP):
    2 layers, hidden 64, 4 query / 2 K/V heads, rotary positions, vocab 256, batch 2 x 16."""
    preset = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_kv_heads": 2, "new_decoder_architecture": True, "max_position_embeddings": 64,
              "hidden_dropout": 0.0, "attention_dropout": 0.0, "use_cache": False, "bos_token_id": 1,
              "eos_token_id": 2, "pad_token_id": 0}
    return _make("FalconConfig", "FalconForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_qwen3(**overrides: Any) -> HFExample:
    """``Qwen3ForCausalLM`` (per-head q/k RMSNorm): :func:`hf_llama` shapes, head dim 16."""
    preset = {**_DECODER, "head_dim": 16}
    return _make("Qwen3Config", "Qwen3ForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_mamba(**overrides: Any) -> HFExample:
    """``MambaForCausalLM`` (selective state space, a sequential scan over the tokens): 2 layers, hidden 64,
    state 8, vocab 256, batch 2 x 16."""
    preset = {"vocab_size": 256, "hidden_size": 64, "state_size": 8, "num_hidden_layers": 2, "expand": 2,
              "conv_kernel": 4, "use_cache": False, "use_mambapy": False, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 0}
    return _make("MambaConfig", "MambaForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_mamba2(**overrides: Any) -> HFExample:
    """``Mamba2ForCausalLM`` (state space duality, chunked): 2 layers, hidden 64, 4 heads of 32, state 8,
    chunks of 8 tokens, vocab 256, batch 2 x 16."""
    preset = {"vocab_size": 256, "hidden_size": 64, "state_size": 8, "num_hidden_layers": 2, "expand": 2,
              "num_heads": 4, "head_dim": 32, "n_groups": 1, "chunk_size": 8, "conv_kernel": 4,
              "use_cache": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    return _make("Mamba2Config", "Mamba2ForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_gemma3(**overrides: Any) -> HFExample:
    """``Gemma3ForCausalLM`` (text): :func:`hf_llama` shapes, head dim 16, a sliding-window layer (window 8)
    then a full-attention one, each type with its own rotary table."""
    preset = {**_DECODER, "head_dim": 16, "sliding_window": 8,
              "layer_types": ["sliding_attention", "full_attention"]}
    return _make("Gemma3TextConfig", "Gemma3ForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_mixtral(**overrides: Any) -> HFExample:
    """``MixtralForCausalLM``: :func:`hf_llama` shapes with 4 experts, top-2, in the library's default experts code."""
    preset = {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2}
    return _make("MixtralConfig", "MixtralForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_qwen3_moe(**overrides: Any) -> HFExample:
    """``Qwen3MoeForCausalLM``: :func:`hf_llama` shapes, every layer 4 experts of width 32, top-2."""
    preset = {**_DECODER, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "decoder_sparse_step": 1}
    return _make("Qwen3MoeConfig", "Qwen3MoeForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_deepseek_v3(**overrides: Any) -> HFExample:
    """``DeepseekV3ForCausalLM``: 2 layers (a dense one, then a MoE one with 4 routed experts in 2 groups,
    top-2, and a shared expert), multi-head latent attention with 4 heads (q rank 32, kv rank 16)."""
    preset = {**_DECODER, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
              "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
              "v_head_dim": 16}
    return _make("DeepseekV3Config", "DeepseekV3ForCausalLM", preset, _SEQUENCES, overrides, _causal_lm_inputs)


def hf_llama3_8b(**overrides: Any) -> HFExample:
    """``LlamaForCausalLM`` with LLaMA-3-8B shapes, batch 64 x 2048 on meta (as ``llama3.llama3_8b``)."""
    preset = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
              "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
              "use_cache": False, "bos_token_id": 128000, "eos_token_id": 128001}
    return _make("LlamaConfig", "LlamaForCausalLM", preset, {"batch_size": 64, "seq_len": 2048, "device": "meta"},
                 overrides, _causal_lm_inputs)


def _causal_lm_inputs(config: Any, options: BuildOptions, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``labels`` of shape ``(batch_size, seq_len)``; the model shifts the labels itself."""
    shape = (options.batch_size, options.seq_len or 16)
    return {"input_ids": random_tokens(shape, config.vocab_size, generator),
            "labels": random_tokens(shape, config.vocab_size, generator)}


def _speech_inputs(config: Any, options: BuildOptions, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """``input_features`` of shape ``(batch_size, num_mel_bins, 2 * max_source_positions)`` (the encoder's
    two convolutions halve the frames to its positions) and ``labels`` of shape ``(batch_size, seq_len)``."""
    frames = 2 * config.max_source_positions
    return {"input_features": random_floats((options.batch_size, config.num_mel_bins, frames), options.torch_dtype,
                                            generator),
            "labels": random_tokens((options.batch_size, options.seq_len or 16), config.vocab_size, generator)}


def _make(
    config_name: str,
    model_name: str,
    preset: Mapping[str, Any],
    defaults: Mapping[str, Any],
    overrides: Mapping[str, Any],
    make_inputs: Callable[[Any, BuildOptions, torch.Generator | None], dict[str, torch.Tensor]],
) -> HFExample:
    """Build ``transformers.<model_name>(<config_name>(**preset, **overrides))`` and its inputs."""
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as exc:
        raise ValueError(f"the Hugging Face examples need transformers (pip install -e '.[dev]'): {exc}") from None
    config_type = getattr(transformers, config_name)
    # the build option `dtype` wins over the config's field of the same name
    fields = {f.name for f in dataclasses.fields(config_type)} - set(_OPTIONS)
    unknown = sorted(set(overrides) - fields - set(_OPTIONS) - set(_IMPLEMENTATIONS))
    if unknown:
        valid = ", ".join(sorted(fields | set(_OPTIONS) | set(_IMPLEMENTATIONS)))
        raise ValueError(f"unknown override(s) {', '.join(unknown)}; valid names: {valid}")
    options = BuildOptions(**{**defaults, **{k: v for k, v in overrides.items() if k in _OPTIONS}})
    config = config_type(**{**preset, **{k: v for k, v in overrides.items() if k not in _OPTIONS}})
    model_type = getattr(transformers, model_name)
    model, inputs = build_example(options, lambda: model_type(config), lambda gen: make_inputs(config, options, gen))
    return model, inputs
