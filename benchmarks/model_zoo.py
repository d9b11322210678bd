"""Which models trace as given, how fast, how well the rules cover them, how many strategies they get.

One row per model: traced or not (with the one-line error), trace seconds,
graph nodes, rule coverage (distinct ops, in percent) and the mean number of
strategies per op node on meshes 8, 8x8 and 2x4x8 (``RuleRegistry.strategies``,
as ``benchmarks/strategy_counts.py`` counts them). Models: the project's
examples and Hugging Face ``transformers`` models at their published widths
with 2 layers, all on meta tensors (timm / torchtitan rows would need those
packages; they are not dependencies). Then the trace time of LLaMA-3-8B
(32 layers, batch 64 x 2048) as ``transformers`` builds it and as
``examples.models.llama3`` does. Not a test.

    python -m benchmarks.model_zoo               # everything (minutes)
    python -m benchmarks.model_zoo --no-8b       # the table only
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from autoshard.coverage import compute_coverage
from autoshard.rules import load_rules
from autoshard.trace import trace_joint
from benchmarks.strategy_counts import count_strategies

MESHES = ((8,), (8, 8), (2, 4, 8))
TWO_LAYERS_META = {"device": "meta", "batch_size": 8, "seq_len": 1024}

# (label, "module:factory", overrides)
ZOO: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("mlp small", "examples.models.mlp:small", {"device": "meta"}),
    ("gpt2 124M", "examples.models.gpt2:gpt2_small", {"device": "meta"}),
    ("llama3 8B, 2 layers", "examples.models.llama3:llama3_8b", {"n_layers": 2, "batch_size": 8, "seq_len": 1024}),
    ("moe small", "examples.models.moe:small", {"device": "meta"}),
    ("convnet small", "examples.models.convnet:small", {"device": "meta"}),
    ("vit base", "examples.models.vit:vit_base", {"device": "meta"}),
    ("HF LLaMA-3 8B, 2 layers, sdpa", "examples.models.hf:hf_llama3_8b",
     {"num_hidden_layers": 2, **TWO_LAYERS_META}),
    ("HF LLaMA-3 8B, 2 layers, eager", "examples.models.hf:hf_llama3_8b",
     {"num_hidden_layers": 2, "attn_implementation": "eager", **TWO_LAYERS_META}),
    ("HF Mistral 7B, 2 layers", "examples.models.hf:hf_mistral",
     {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_key_value_heads": 8, "max_position_embeddings": 4096, "sliding_window": 4096, **TWO_LAYERS_META}),
    ("HF GPT-2 124M, 2 layers", "examples.models.hf:hf_gpt2",
     {"vocab_size": 50257, "n_embd": 768, "n_head": 12, "n_positions": 1024, **TWO_LAYERS_META}),
    ("HF BERT base, 2 layers", "examples.models.hf:hf_bert",
     {"vocab_size": 30522, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
      "max_position_embeddings": 512, **{**TWO_LAYERS_META, "seq_len": 512}}),
    ("HF T5 small, 2+2 layers", "examples.models.hf:hf_t5",
     {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_heads": 8, **TWO_LAYERS_META}),
    ("HF Mixtral 8x7B, 2 layers, fp32", "examples.models.hf:hf_mixtral",
     {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_key_value_heads": 8, "num_local_experts": 8, "max_position_embeddings": 4096, **TWO_LAYERS_META}),
    ("HF Mixtral 8x7B, 2 layers, bf16", "examples.models.hf:hf_mixtral",
     {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_key_value_heads": 8, "num_local_experts": 8, "max_position_embeddings": 4096, "dtype": "bfloat16",
      **TWO_LAYERS_META}),
)


@dataclass(frozen=True, slots=True)
class ZooRow:
    """One model's line of the table."""

    label: str
    """What was built."""
    error: str
    """The one-line reason it did not trace; empty when it did."""
    trace_s: float = 0.0
    """Seconds to trace."""
    nodes: int = 0
    """``call_function`` nodes of the joint graph."""
    coverage_percent: float = 0.0
    """Distinct ops with a rule, in percent."""
    uncovered: tuple[str, ...] = ()
    """Ops without a rule."""
    mean_strategies: tuple[float, ...] = ()
    """Mean strategies per op node, one per mesh of :data:`MESHES`."""


def build(spec: str, overrides: dict[str, Any]) -> tuple[Any, Any]:
    """Call the factory ``module:factory`` with ``overrides``."""
    module_name, _, factory = spec.partition(":")
    return getattr(importlib.import_module(module_name), factory)(**overrides)


def measure(label: str, spec: str, overrides: dict[str, Any]) -> ZooRow:
    """Trace one model and count its coverage and strategies; a failure becomes the row's error."""
    try:
        model, inputs = build(spec, overrides)
        start = time.perf_counter()
        traced = trace_joint(model, inputs)
        trace_s = time.perf_counter() - start
    except Exception as exc:  # the table reports every failure, it does not stop at the first
        return ZooRow(label=label, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    report = compute_coverage(traced, load_rules(), model=label)
    means = tuple(count_strategies(traced, mesh, model=label).mean_strategies for mesh in MESHES)
    return ZooRow(
        label=label, error="", trace_s=trace_s, nodes=len(traced.nodes), coverage_percent=report.percent,
        uncovered=tuple(row.op for row in report.ops if not row.covered), mean_strategies=means,
    )


def format_table(rows: list[ZooRow]) -> str:
    """The markdown table."""
    meshes = " | ".join(f"strategies/node {'x'.join(map(str, mesh))}" for mesh in MESHES)
    lines = [f"| model | traced | trace s | nodes | coverage | {meshes} | no rule / error |",
             "|---|---|---:|---:|---:|" + "---:|" * len(MESHES) + "---|"]
    for row in rows:
        if row.error:
            lines.append(f"| {row.label} | no | | | |" + " |" * len(MESHES) + f" {row.error} |")
            continue
        means = " | ".join(f"{m:.1f}" for m in row.mean_strategies)
        lines.append(f"| {row.label} | yes | {row.trace_s:.1f} | {row.nodes} | {row.coverage_percent:.0f} % | "
                     f"{means} | {', '.join(row.uncovered)} |")
    return "\n".join(lines)


def time_8b() -> str:
    """Trace seconds of LLaMA-3-8B built by transformers and by the project's example, same batch and sequence."""
    lines = ["| LLaMA-3-8B (32 layers, batch 64 x 2048, meta) | trace s | nodes |", "|---|---:|---:|"]
    for label, spec in (("transformers LlamaForCausalLM (sdpa)", "examples.models.hf:hf_llama3_8b"),
                        ("examples.models.llama3:llama3_8b", "examples.models.llama3:llama3_8b")):
        model, inputs = build(spec, {"batch_size": 64, "seq_len": 2048, "device": "meta"})
        start = time.perf_counter()
        traced = trace_joint(model, inputs)
        lines.append(f"| {label} | {time.perf_counter() - start:.1f} | {len(traced.nodes)} |")
        del model, traced
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-8b", action="store_true", help="skip the 32-layer LLaMA-3-8B trace timing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    rows = []
    for label, spec, overrides in ZOO:
        rows.append(measure(label, spec, overrides))
        print(f"done {label}", file=sys.stderr)
    missing = [name for name in ("timm", "torchtitan") if importlib.util.find_spec(name) is None]
    print(format_table(rows))
    if missing:
        print(f"\n({', '.join(missing)} not installed: no rows for them)")
    if not args.no_8b:
        print()
        print(time_8b())
    return 0


if __name__ == "__main__":
    sys.exit(main())
