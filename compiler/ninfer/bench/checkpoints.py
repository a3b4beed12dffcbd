"""Random-weight Qwen3 checkpoints that the benchmarks compile (benchmarks/bench_decode.py,
benchmarks/bench_serving.py): fixed seed, the demo tokenizer, made with transformers."""

from __future__ import annotations

from pathlib import Path

SIZES = {  # hidden, intermediate, layers, heads, kv heads
    "small": (512, 1536, 8, 8, 4),
    "medium": (1024, 3072, 16, 16, 8),
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
    config = Qwen3Config(vocab_size=(facts["vocab_size"] + 63) // 64 * 64, hidden_size=hidden,
                         intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, head_dim=64,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=facts["eos_token_id"])
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(directory)
