"""Random-weight Qwen3 checkpoints that the benchmarks compile (benchmarks/bench_decode.py,
benchmarks/bench_serving.py, benchmarks/bench_structured.py): fixed seed, the demo
tokenizer, made with transformers; and their compiled builds under build/bench/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SIZES = {  # hidden, intermediate, layers, heads, kv heads
    "small": (512, 1536, 8, 8, 4),
    "medium": (1024, 3072, 16, 16, 8),
    # a ~0.5B-shaped Qwen3.5 hybrid (Qwen3_5ForCausalLM): 18 Gated DeltaNet layers (16 key
    # and 16 value heads of 128) and 6 gated full-attention ones (head_dim 256, partial
    # rotary 0.25), as the small Qwen3.5 checkpoints are shaped
    "hybrid": (1024, 3584, 24, 8, 2),
}


def build_checkpoint(directory: Path, size: str) -> None:
    """Write the `size` checkpoint into `directory` unless it is there already."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ninfer.demo.checkpoint import write_tokenizer_files

    if (directory / "config.json").exists():
        return
    facts = write_tokenizer_files(directory, "qwen", vocab_size=2048)
    hidden, inter, layers, heads, kv = SIZES[size]
    torch.manual_seed(0)
    if size == "hybrid":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        Qwen3_5ForCausalLM(Qwen3_5TextConfig(
            vocab_size=(facts["vocab_size"] + 63) // 64 * 64, hidden_size=hidden,
            intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=kv, head_dim=256, linear_num_key_heads=16,
            linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=False,
            eos_token_id=facts["eos_token_id"])).save_pretrained(directory)
        return
    config = Qwen3Config(vocab_size=(facts["vocab_size"] + 63) // 64 * 64, hidden_size=hidden,
                         intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, head_dim=64,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=facts["eos_token_id"])
    Qwen3ForCausalLM(config).save_pretrained(directory)


def compiled_checkpoint(size: str, variant: str, **options: Any) -> Path:
    """The `size` checkpoint (built once) compiled for `cpu` into
    build/bench/qwen3-<size>-cpu-<variant> with `options` (CompileOptions fields); the
    compile is reused while the options match. Returns the build directory."""
    from ninfer.paths import DEFAULT_BUILD_DIR
    from ninfer.pipeline import CompileOptions, compile_model

    root = DEFAULT_BUILD_DIR / "bench"
    ckpt = root / f"qwen3-{size}"
    build_checkpoint(ckpt, size)
    out = root / f"qwen3-{size}-cpu-{variant}"
    compile_model(CompileOptions(model_dir=ckpt, out_dir=out, model_id=f"qwen3-{size}",
                                 python_module=False, **options))
    return out
