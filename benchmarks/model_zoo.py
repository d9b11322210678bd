"""Which models trace as given, how fast, how well the rules cover them, how many strategies they get.

One row per model: traced or not (with the one-line error), trace seconds,
graph nodes, rule coverage (distinct ops, in percent) and the mean number of
strategies per op node on meshes 8, 8x8 and 2x4x8 (``RuleRegistry.strategies``,
as ``benchmarks/strategy_counts.py`` counts them), and the plan on mesh 2x2:
``autoshard.solve`` on the ``h100-sxm-80gb`` profile (20 s), its estimated
step and the solver's status, the plan file written to ``--plan-dir``.
Models: the project's examples, Hugging Face ``transformers`` models and
torchtitan's LLaMA-3, at their published widths with 2 layers, all on meta
tensors. torchtitan comes with the ``zoo`` extra (``pip install '.[zoo]'``;
its rows are left out, and said so, where it is not installed); timm has no
row: it imports torchvision, and PyPI's torchvision wheels link
``libtorch_cuda`` (no CPU build), so it cannot be imported beside the CPU
torch (``benchmarks/results/model_zoo.md``). Then the trace time of
LLaMA-3-8B (32 layers, batch 64 x 2048) as ``transformers`` builds it and as
``examples.models.llama3`` does, and one training step of tiny Whisper and
Falcon on 4 gloo ranks with the solver's plan against one device
(:mod:`benchmarks.zoo_runtime`). Not a test.

The column "wrong strategies on real calls" comes from
:mod:`autoshard.validation.real_calls`: the same model at the tiny size its
factory has for tests (the published widths do not fit a CPU run of every
strategy), every distinct call of its joint graph run on real values (those
the graph computes from the model's random weights and inputs, plus random
finite ones where those hold masks), every strategy of it checked on
simulated meshes 2, 4 and 2x2 against the unsharded op. "checked / skipped"
counts strategies (skipped: no valid inputs could be made, or extreme values
only; ops without a rule are replicate-only and not counted). The target is
0 wrong.

    python -m benchmarks.model_zoo               # everything (an hour on 2 cores)
    python -m benchmarks.model_zoo --no-8b --no-real-calls --only whisper --only falcon
    python -m benchmarks.model_zoo --no-plans --no-runtime   # the trace / coverage / strategies table only
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/model_zoo.py`: re-executed as the module

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.validation.coverage import compute_coverage
from autoshard.rules import load_rules
from autoshard.validation.real_calls import validate_model
from autoshard.trace import trace_joint
from benchmarks import zoo_runtime
from benchmarks.common.models import load
from benchmarks.strategy_counts import count_strategies

MESHES = ((8,), (8, 8), (2, 4, 8))
REAL_CALL_MESHES = ((2,), (4,), (2, 2))
TWO_LAYERS_META = {"device": "meta", "batch_size": 8, "seq_len": 1024}
PLAN_MESH = ((2, 2), ("dp", "tp"))
PLAN_PROFILE = "h100-sxm-80gb"
PLAN_TIME_LIMIT_S = 20.0
REQUIRES = {"examples.models.hf": "transformers", "examples.models.titan": "torchtitan"}
"""Factory module -> the optional package it needs (rows whose package is missing are left out, and said so)."""

# (label, "module:factory", overrides, (tiny "module:factory", overrides) for the real-call check)
ZOO: tuple[tuple[str, str, dict[str, Any], tuple[str, dict[str, Any]]], ...] = (
    ("mlp small", "examples.models.mlp:small", {"device": "meta"},
     ("examples.models.mlp:tiny", {})),
    ("gpt2 124M", "examples.models.gpt2:gpt2_small", {"device": "meta"},
     ("examples.models.gpt2:tiny", {})),
    ("llama3 8B, 2 layers", "examples.models.llama3:llama3_8b", {"n_layers": 2, "batch_size": 8, "seq_len": 1024},
     ("examples.models.llama3:tiny", {})),
    ("moe small", "examples.models.moe:small", {"device": "meta"},
     ("examples.models.moe:tiny", {})),
    ("convnet small", "examples.models.convnet:small", {"device": "meta"},
     ("examples.models.convnet:tiny", {})),
    ("vit base", "examples.models.vit:vit_base", {"device": "meta"},
     ("examples.models.vit:tiny", {})),
    ("HF LLaMA-3 8B, 2 layers, sdpa", "examples.models.hf:hf_llama3_8b",
     {"num_hidden_layers": 2, **TWO_LAYERS_META},
     ("examples.models.hf:hf_llama", {})),
    ("HF LLaMA-3 8B, 2 layers, eager", "examples.models.hf:hf_llama3_8b",
     {"num_hidden_layers": 2, "attn_implementation": "eager", **TWO_LAYERS_META},
     ("examples.models.hf:hf_llama", {"attn_implementation": "eager"})),
    ("HF Mistral 7B, 2 layers", "examples.models.hf:hf_mistral",
     {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_key_value_heads": 8, "max_position_embeddings": 4096, "sliding_window": 4096, **TWO_LAYERS_META},
     ("examples.models.hf:hf_mistral", {})),
    ("HF GPT-2 124M, 2 layers", "examples.models.hf:hf_gpt2",
     {"vocab_size": 50257, "n_embd": 768, "n_head": 12, "n_positions": 1024, **TWO_LAYERS_META},
     ("examples.models.hf:hf_gpt2", {})),
    ("HF BERT base, 2 layers", "examples.models.hf:hf_bert",
     {"vocab_size": 30522, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
      "max_position_embeddings": 512, **{**TWO_LAYERS_META, "seq_len": 512}},
     ("examples.models.hf:hf_bert", {})),
    ("HF T5 small, 2+2 layers", "examples.models.hf:hf_t5",
     {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_heads": 8, **TWO_LAYERS_META},
     ("examples.models.hf:hf_t5", {})),
    ("HF Mixtral 8x7B, 2 layers, fp32", "examples.models.hf:hf_mixtral",
     {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_key_value_heads": 8, "num_local_experts": 8, "max_position_embeddings": 4096, **TWO_LAYERS_META},
     ("examples.models.hf:hf_mixtral", {})),
    ("HF Mixtral 8x7B, 2 layers, bf16", "examples.models.hf:hf_mixtral",
     {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_key_value_heads": 8, "num_local_experts": 8, "max_position_embeddings": 4096, "dtype": "bfloat16",
      **TWO_LAYERS_META},
     ("examples.models.hf:hf_mixtral", {"dtype": "bfloat16"})),
    ("HF Qwen3-MoE 30B-A3B, 2 layers, fp32", "examples.models.hf:hf_qwen3_moe",
     {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
      "num_experts": 128, "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4,
      "max_position_embeddings": 32768, **TWO_LAYERS_META},
     ("examples.models.hf:hf_qwen3_moe", {})),
    ("HF DeepSeek-V3, 2 layers (dense + MoE), fp32", "examples.models.hf:hf_deepseek_v3",
     {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
      "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
      "n_group": 8, "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
      "qk_nope_head_dim": 128, "v_head_dim": 128, "first_k_dense_replace": 1, "max_position_embeddings": 4096,
      **TWO_LAYERS_META},
     ("examples.models.hf:hf_deepseek_v3", {})),
    ("HF Whisper base, 2+2 layers", "examples.models.hf:hf_whisper",
     {"vocab_size": 51865, "num_mel_bins": 80, "d_model": 512, "encoder_attention_heads": 8,
      "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "max_source_positions": 1500,
      "max_target_positions": 448, **{**TWO_LAYERS_META, "seq_len": 448}},
     ("examples.models.hf:hf_whisper", {})),
    ("HF Falcon 40B (new decoder architecture), 2 layers", "examples.models.hf:hf_falcon",
     {"vocab_size": 65024, "hidden_size": 8192, "num_attention_heads": 128, "num_kv_heads": 8,
      "max_position_embeddings": 2048, **TWO_LAYERS_META},
     ("examples.models.hf:hf_falcon", {})),
    ("torchtitan LLaMA-3 8B, 2 layers", "examples.models.titan:titan_llama3_8b", {"n_layers": 2},
     ("examples.models.titan:titan_llama3", {})),
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
    real_wrong: int | None = None
    """Wrong strategies found on the real calls of the tiny model (None: not checked)."""
    real_checked: int = 0
    """Strategies of real calls checked (meshes of :data:`REAL_CALL_MESHES`)."""
    real_skipped: int = 0
    """Strategies of real calls not checked (no valid inputs)."""
    real_calls: int = 0
    """Distinct real calls with a rule."""
    real_error: str = ""
    """Why the real calls could not be checked."""
    real_failures: tuple[str, ...] = ()
    """The first wrong strategies, for the notes under the table."""
    plan: str = ""
    """The 2x2 plan: estimated step and solver status, or why there is none (empty: not solved)."""


def check_real_calls(tiny: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """ZooRow fields of the real-call check of the tiny model ``tiny`` (:mod:`autoshard.validation.real_calls`)."""
    try:
        model, inputs = load(*tiny)
        report = validate_model(model, inputs, REAL_CALL_MESHES, synthesized=True)
    except Exception as exc:  # reported in the row
        return {"real_error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {"real_wrong": report.wrong_strategies, "real_checked": report.strategies_checked,
            "real_skipped": report.strategies_skipped, "real_calls": report.calls,
            "real_failures": tuple(str(f) for f in report.failures[:3])}


def solve_2x2(spec: str, overrides: dict[str, Any], path: Path | None) -> str:
    """``"<step ms> ms (<status>)"`` of the model's plan on mesh 2x2, written to ``path``; or ``"error: ..."``."""
    from autoshard.search.api import solve

    try:
        model, inputs = load(spec, overrides)
        plan = solve(model, inputs, *PLAN_MESH, profile=PLAN_PROFILE, time_limit=PLAN_TIME_LIMIT_S)
        if path is not None:
            plan.save(path)
    except Exception as exc:  # reported in the row
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return f"{plan.estimate.step_s * 1e3:.1f} ms ({plan.solver.status})"


def measure(label: str, spec: str, overrides: dict[str, Any], tiny: tuple[str, dict[str, Any]] | None = None,
            *, real_calls: bool = True, plan_path: Path | None = None, plans: bool = True) -> ZooRow:
    """Trace one model and count its coverage and strategies; a failure becomes the row's error.
    ``tiny``: the factory whose real calls are checked (``real_calls``); ``plans``: solve it on
    2x2 and write the plan to ``plan_path``."""
    real = check_real_calls(tiny) if tiny is not None and real_calls else {}
    try:
        model, inputs = load(spec, overrides)
        start = time.perf_counter()
        traced = trace_joint(model, inputs)
        trace_s = time.perf_counter() - start
        node_count = len(traced.nodes)
    except Exception as exc:  # the table reports every failure, it does not stop at the first
        return ZooRow(label=label, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", **real)
    report = compute_coverage(traced, load_rules(), model=label)
    means = tuple(count_strategies(traced, mesh, model=label).mean_strategies for mesh in MESHES)
    del traced, model, inputs  # the solve builds and traces its own
    plan = solve_2x2(spec, overrides, plan_path) if plans else ""
    return ZooRow(
        label=label, error="", trace_s=trace_s, nodes=node_count, coverage_percent=report.percent,
        uncovered=tuple(row.op for row in report.ops if not row.covered), mean_strategies=means, plan=plan, **real,
    )


def format_table(rows: list[ZooRow]) -> str:
    """The markdown table."""
    meshes = " | ".join(f"strategies/node {'x'.join(map(str, mesh))}" for mesh in MESHES)
    lines = [f"| model | traced | trace s | nodes | coverage | {meshes} | plan 2x2 (step, status) | "
             "wrong strategies on real calls | real calls: checked / skipped | no rule / error |",
             "|---|---|---:|---:|---:|" + "---:|" * len(MESHES) + "---|---:|---:|---|"]
    notes = []
    for row in rows:
        if row.real_error:
            wrong, checked = "error", ""
            notes.append(f"{row.label}: real calls not checked: {row.real_error}")
        elif row.real_wrong is None:
            wrong, checked = "", ""
        else:
            wrong, checked = str(row.real_wrong), f"{row.real_checked} / {row.real_skipped} ({row.real_calls} calls)"
            notes += [f"{row.label}: {failure}" for failure in row.real_failures]
        if row.error:
            lines.append(f"| {row.label} | no | | | |" + " |" * len(MESHES) + f" | {wrong} | {checked} | {row.error} |")
            continue
        means = " | ".join(f"{m:.1f}" for m in row.mean_strategies)
        plan = row.plan
        if plan.startswith("error: "):
            notes.append(f"{row.label}: no 2x2 plan: {plan[len('error: '):]}")
            plan = "error (note)"
        lines.append(f"| {row.label} | yes | {row.trace_s:.1f} | {row.nodes} | {row.coverage_percent:.0f} % | "
                     f"{means} | {plan} | {wrong} | {checked} | {', '.join(row.uncovered)} |")
    total = sum(row.real_wrong or 0 for row in rows)
    lines.append("")
    lines.append(f"{total} wrong strategies on real calls (tiny configs of the same models, meshes "
                 f"{', '.join('x'.join(map(str, m)) for m in REAL_CALL_MESHES)}).")
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def time_8b() -> str:
    """Trace seconds of LLaMA-3-8B built by transformers and by the project's example, same batch and sequence."""
    lines = ["| LLaMA-3-8B (32 layers, batch 64 x 2048, meta) | trace s | nodes |", "|---|---:|---:|"]
    for label, spec in (("transformers LlamaForCausalLM (sdpa)", "examples.models.hf:hf_llama3_8b"),
                        ("examples.models.llama3:llama3_8b", "examples.models.llama3:llama3_8b")):
        model, inputs = load(spec, {"batch_size": 64, "seq_len": 2048, "device": "meta"})
        start = time.perf_counter()
        traced = trace_joint(model, inputs)
        lines.append(f"| {label} | {time.perf_counter() - start:.1f} | {len(traced.nodes)} |")
        del model, traced
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-8b", action="store_true", help="skip the 32-layer LLaMA-3-8B trace timing")
    parser.add_argument("--no-real-calls", action="store_true",
                        help="skip the real-call check of the tiny models (about a minute on one core)")
    parser.add_argument("--no-plans", action="store_true", help="skip the 2x2 solve of every model")
    parser.add_argument("--plan-dir", type=Path, default=None, metavar="DIR",
                        help="write the 2x2 plans here (default: a temporary folder, removed at the end)")
    parser.add_argument("--no-runtime", action="store_true",
                        help="skip the 4-rank training step of tiny Whisper and Falcon (benchmarks.zoo_runtime)")
    parser.add_argument("--only", action="append", default=None, metavar="TEXT",
                        help="only rows whose label contains TEXT, case-insensitive (repeatable; also the runtime rows)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    rows, missing = [], set()
    with tempfile.TemporaryDirectory(prefix="autoshard-zoo-plans-") as tmp:
        plan_dir = args.plan_dir or Path(tmp)
        plan_dir.mkdir(parents=True, exist_ok=True)
        for label, spec, overrides, tiny in ZOO:
            if args.only and not any(text.lower() in label.lower() for text in args.only):
                continue
            package = REQUIRES.get(spec.partition(":")[0])
            if package is not None and importlib.util.find_spec(package) is None:
                missing.add(package)
                continue
            slug = "".join(c if c.isalnum() else "_" for c in label.lower()).strip("_")
            rows.append(measure(label, spec, overrides, tiny, real_calls=not args.no_real_calls,
                                plan_path=plan_dir / f"{slug}.json", plans=not args.no_plans))
            print(f"done {label}", file=sys.stderr)
        print(format_table(rows))
        if not args.no_plans:
            print(f"\n2x2 plans ({PLAN_PROFILE}, {PLAN_TIME_LIMIT_S:.0f} s each) written to "
                  f"{plan_dir if args.plan_dir else 'a temporary folder (pass --plan-dir to keep them)'}")
    if missing:
        print(f"\n({', '.join(sorted(missing))} not installed: no rows for them; pip install '.[zoo]' for torchtitan)")
    print("\n(timm: no rows; it imports torchvision, whose PyPI wheels link libtorch_cuda and do not import "
          "beside the CPU torch)")
    if not args.no_8b:
        print()
        print(time_8b())
    if not args.no_runtime:
        print()
        print(zoo_runtime.format_rows(zoo_runtime.run_all(args.only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
