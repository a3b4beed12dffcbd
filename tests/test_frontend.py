"""Frontend and plan: checkpoints -> graph, with clear errors for what is unsupported."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from ninfer.frontend import FrontendError, open_checkpoint
from ninfer.frontend.graph import rope_tables
from ninfer.frontend.llama import build_graph
from ninfer.plan import PlanError, ServeLimits, make_plan
from ninfer.targets import load_target

pytestmark = pytest.mark.unit

BASE = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 64,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512, "tie_word_embeddings": True}


def _tensors(cfg, skip=()):
    cfg = {**BASE, **cfg}
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim", h // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (64, h), "model.norm.weight": (h,),
              "model.layers.0.input_layernorm.weight": (h,),
              "model.layers.0.post_attention_layernorm.weight": (h,),
              "model.layers.0.self_attn.q_proj.weight": (q, h),
              "model.layers.0.self_attn.k_proj.weight": (kv, h),
              "model.layers.0.self_attn.v_proj.weight": (kv, h),
              "model.layers.0.self_attn.q_proj.bias": (q,),
              "model.layers.0.self_attn.k_proj.bias": (kv,),
              "model.layers.0.self_attn.v_proj.bias": (kv,),
              "model.layers.0.self_attn.o_proj.weight": (h, q),
              "model.layers.0.mlp.gate_proj.weight": (inter, h),
              "model.layers.0.mlp.up_proj.weight": (inter, h),
              "model.layers.0.mlp.down_proj.weight": (h, inter)}
    return {k: np.ones(v, np.float32) for k, v in shapes.items() if k not in skip}


def make_ckpt(tmp_path, cfg=BASE, skip=(), shards=1):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    tensors = _tensors(cfg, skip)
    if shards == 1:
        save_file(tensors, str(tmp_path / "model.safetensors"))
    else:
        names = sorted(tensors)
        weight_map = {}
        for i in range(shards):
            part = {n: tensors[n] for n in names[i::shards]}
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(tmp_path / fname))
            weight_map.update(dict.fromkeys(part, fname))
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": weight_map}))
    return tmp_path


def test_qwen2_graph_has_biases_and_fused_gate_up(tmp_path):
    graph = build_graph(open_checkpoint(make_ckpt(tmp_path)))
    names = {w.name for w in graph.weights}
    assert {"layers.0.q_bias", "layers.0.k_bias", "layers.0.v_bias"} <= names
    assert graph.weight("layers.0.gate_up").shape == (96, 32)
    assert graph.weight("lm_head").sources == ("model.embed_tokens.weight",)  # tied
    assert not graph.traits.qk_norm


def test_sharded_checkpoint_reads_every_shard(tmp_path):
    ckpt = open_checkpoint(make_ckpt(tmp_path, shards=3))
    assert len({t.file for t in ckpt.tensors.values()}) == 3
    graph = build_graph(ckpt)
    gu = graph.load_weight(ckpt, graph.weight("layers.0.gate_up"))
    assert gu.shape == (96, 32) and gu.dtype == np.float32


def test_bf16_widening_is_exact(tmp_path):
    import torch
    from safetensors.torch import save_file as save_torch

    ckpt_dir = make_ckpt(tmp_path)
    values = torch.randn(64, 32).to(torch.bfloat16)
    tensors = {k: torch.from_numpy(v) for k, v in _tensors(BASE).items()}
    tensors["model.embed_tokens.weight"] = values
    save_torch(tensors, str(ckpt_dir / "model.safetensors"))
    ckpt = open_checkpoint(ckpt_dir)
    assert ckpt.tensors["model.embed_tokens.weight"].dtype == "BF16"
    np.testing.assert_array_equal(ckpt.load("model.embed_tokens.weight"),
                                  values.float().numpy())


@pytest.mark.parametrize(("matmul_dtype", "embed_dtype", "expected"), [
    ("bfloat16", "bfloat16", "bf16"), ("float16", "float16", "f16"),
    ("float16", "float32", "f32"),  # tied: the lm_head is the f32 embedding
    ("float32", "bfloat16", "f32"), ("mixed", "float16", "f32")])
def test_default_weight_format_is_the_checkpoints_dtype(tmp_path, matmul_dtype, embed_dtype,
                                                        expected):
    """--weights auto (the default) keeps 16-bit matmul weights (lm_head included) 16-bit;
    any other dtype or a mix of them is stored as f32, which holds each of them exactly."""
    import torch
    from safetensors.torch import save_file as save_torch

    from ninfer.frontend.model import read_model
    from ninfer.options import CompileOptions

    ckpt_dir = make_ckpt(tmp_path)
    tensors = {}
    for i, (name, value) in enumerate(_tensors(BASE).items()):
        if name.endswith("proj.weight"):
            dtype = (("float16", "bfloat16")[i % 2] if matmul_dtype == "mixed"
                     else matmul_dtype)
        else:
            dtype = embed_dtype if name == "model.embed_tokens.weight" else "float32"
        tensors[name] = torch.from_numpy(value).to(getattr(torch, dtype))
    save_torch(tensors, str(ckpt_dir / "model.safetensors"))
    model = read_model(ckpt_dir)
    assert model.native_weight_format() == expected
    opts, note = CompileOptions(ckpt_dir).with_checkpoint_weights(model.native_weight_format())
    assert opts.weights == expected
    assert note == f"--weights not given: {expected}, the checkpoint's own dtype"
    given, none = CompileOptions(ckpt_dir, weights="q8g32").with_checkpoint_weights(expected)
    assert (given.weights, none) == ("q8g32", None)


def test_unsupported_architecture_is_named(tmp_path):
    cfg = {**BASE, "architectures": ["GPT2LMHeadModel"]}
    with pytest.raises(FrontendError, match=r"'GPT2LMHeadModel' is not supported.*Qwen3"):
        build_graph(open_checkpoint(make_ckpt(tmp_path, cfg)))


def test_missing_tensor_is_named(tmp_path):
    ckpt = open_checkpoint(make_ckpt(tmp_path, skip=("model.layers.0.mlp.up_proj.weight",)))
    with pytest.raises(FrontendError, match=r"missing tensor\(s\) model\.layers\.0\.mlp\.up"):
        build_graph(ckpt)


def test_missing_config_field_and_bad_rope(tmp_path):
    cfg = {k: v for k, v in BASE.items() if k != "hidden_size"}
    with pytest.raises(FrontendError, match="missing required field 'hidden_size'"):
        open_checkpoint(make_ckpt(tmp_path / "a", cfg))
    cfg = {**BASE, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}
    with pytest.raises(FrontendError, match=r"rope type 'longrope' is not supported \(supported: "
                       r"default, linear, llama3, yarn\)"):
        open_checkpoint(make_ckpt(tmp_path / "b", cfg))
    cfg = {**BASE, "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 64}}
    with pytest.raises(FrontendError, match="yarn rope scaling needs a 'factor'"):
        open_checkpoint(make_ckpt(tmp_path / "c", cfg))


def test_no_weights_and_missing_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    with pytest.raises(FrontendError, match=r"no \*\.safetensors"):
        open_checkpoint(tmp_path)
    with pytest.raises(FrontendError, match="does not exist"):
        open_checkpoint(tmp_path / "nope")


def test_plan_fails_with_numbers_when_memory_does_not_fit(tmp_path):
    graph = build_graph(open_checkpoint(make_ckpt(tmp_path)))
    target = load_target("cpu").with_overrides(memory_gib=0.01)
    with pytest.raises(PlanError, match=r"budget of 10\.2 MiB: weights .* MiB \+ activations "
                       r".* leave 0\.0 MiB for the KV cache, which needs .* MiB for 32 blocks"):
        make_plan(graph, target, ServeLimits(max_context=512, prefill_chunk=64))


def test_plan_reads_one_gemv_stream_where_asked(tmp_path):
    """gemv_streams=1 gives the cpu target's decode matmuls one weight stream a thread;
    the prefill gemms and every CUDA kernel are unchanged."""
    from ninfer.kernels import MatmulSpec

    graph = build_graph(open_checkpoint(make_ckpt(tmp_path)))
    limits = ServeLimits(512, 64, max_concurrency=4)
    for target, want in ((load_target("cpu"), 1), (load_target("h100"), 0)):
        mm = [s for s in make_plan(graph, target, limits, gemv_streams=1).unique_kernels()
              if isinstance(s, MatmulSpec)]
        assert {s.streams for s in mm if s.schedule == "gemv"} == {want}
        assert {s.streams for s in mm if s.schedule == "gemm"} <= {0}
    default = make_plan(graph, load_target("cpu"), limits).unique_kernels()
    assert {s.streams for s in default if isinstance(s, MatmulSpec)} == {0}


def test_plan_rounds_x_to_bf16_for_the_cpu_targets_bf16_weights(tmp_path):
    """x_bf16 (--cpu-bf16-activations, default bf16) marks the cpu target's bf16 matmuls
    only: not another format's (lm_head kept f16 here), not a CUDA target's."""
    from ninfer.kernels import MatmulSpec
    from ninfer.plan import WeightFormats

    graph = build_graph(open_checkpoint(make_ckpt(tmp_path)))
    limits = ServeLimits(512, 64, max_concurrency=4)
    formats = WeightFormats("bf16", (("lm_head", "f16"),))

    def matmuls(target: str, **kw: bool) -> set[tuple[str, bool]]:
        return {(s.wdtype, s.x_bf16) for s in make_plan(
            graph, load_target(target), limits, formats, **kw).unique_kernels()
            if isinstance(s, MatmulSpec)}

    assert matmuls("cpu") == {("bf16", True), ("f16", False)}
    assert matmuls("cpu", x_bf16=False) == {("bf16", False), ("f16", False)}
    assert matmuls("h100") == {("bf16", False), ("f16", False)}


def test_plan_sizes_the_paged_kv_pool(tmp_path):
    graph = build_graph(open_checkpoint(make_ckpt(tmp_path)))
    cpu = load_target("cpu")
    auto = make_plan(graph, cpu, ServeLimits(512, 64, max_concurrency=4))
    assert auto.kv.blocks == 4 * 512 // 16 + 1  # every slot at full context + reserved
    assert auto.kv.tokens == 4 * 512
    assert auto.memory.kv_bytes == auto.kv.blocks * auto.kv.bytes_per_block
    fixed = make_plan(graph, cpu, ServeLimits(512, 64, max_concurrency=4, kv_capacity=1000))
    assert fixed.kv.tokens == 1008  # rounded up to whole blocks
    attention = fixed.kernels["attention"]
    assert (attention.kv_blocks, attention.max_seqs) == (fixed.kv.blocks, 4)
    # auto shrinks to the memory left, but never below one full sequence
    small = cpu.with_overrides(memory_gib=0.0635)
    assert make_plan(graph, small, ServeLimits(512, 64, max_concurrency=64)).kv.tokens < 64 * 512
    with pytest.raises(PlanError, match="cannot hold one sequence of --max-context 512"):
        make_plan(graph, cpu, ServeLimits(512, 64, kv_capacity=100))
    with pytest.raises(PlanError, match="--max-concurrency 65 must be in"):
        make_plan(graph, cpu, ServeLimits(512, 64, max_concurrency=65))


def test_plan_rejects_context_beyond_model(tmp_path):
    graph = build_graph(open_checkpoint(make_ckpt(tmp_path)))
    with pytest.raises(PlanError, match="max_position_embeddings 512"):
        make_plan(graph, load_target("cpu"), ServeLimits(max_context=1024, prefill_chunk=8))


def test_rope_tables_match_transformers():
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from ninfer.frontend.config import RopeConfig

    raw = {"rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, head_dim=32,
                      max_position_embeddings=512, **raw)
    emb = LlamaRotaryEmbedding(cfg)
    pos = torch.arange(300)[None]
    cos, sin = emb(torch.zeros(1, 300, 32), pos)
    our_cos, our_sin = rope_tables(RopeConfig.from_hf(raw), 32, 300)
    np.testing.assert_allclose(our_cos, cos[0, :, :16].numpy(), atol=1e-6)
    np.testing.assert_allclose(our_sin, sin[0, :, :16].numpy(), atol=1e-6)


@pytest.mark.parametrize("scaling", [
    {"factor": 4.0, "original_max_position_embeddings": 64},  # Qwen3's long-context form
    {"factor": 8.0, "original_max_position_embeddings": 128, "beta_fast": 16, "beta_slow": 2,
     "truncate": False},
    {"factor": 2.0, "original_max_position_embeddings": 64, "attention_factor": 0.9},
    {"factor": 4.0, "original_max_position_embeddings": 64, "mscale": 0.707,
     "mscale_all_dim": 1.0},
])
def test_yarn_rope_tables_match_transformers(scaling):
    """cos/sin, attention scaling included, as transformers' Qwen3 rotary embedding."""
    import torch
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    from ninfer.frontend.config import RopeConfig

    raw = {"rope_theta": 1e6, "max_position_embeddings": 512,
           "rope_scaling": {"rope_type": "yarn", **scaling}}
    cfg = Qwen3Config(hidden_size=128, num_attention_heads=4, head_dim=32, **raw)
    emb = Qwen3RotaryEmbedding(cfg)
    assert emb.rope_type == "yarn"
    pos = torch.arange(300)[None]
    cos, sin = emb(torch.zeros(1, 300, 32), pos)
    rope = RopeConfig.from_hf(raw)
    assert rope.attention_factor == pytest.approx(emb.attention_scaling, rel=1e-12)
    our_cos, our_sin = rope_tables(rope, 32, 300)
    np.testing.assert_allclose(our_cos, cos[0, :, :16].numpy(), atol=2e-6, rtol=0)
    np.testing.assert_allclose(our_sin, sin[0, :, :16].numpy(), atol=2e-6, rtol=0)


def _real_config_checkpoint(tmp_path, config: str, arch: str, **kwargs):  # type: ignore[no-untyped-def]
    """A checkpoint directory holding transformers 5.24's default config of `config` (8
    layers) and no real tensors."""
    import transformers

    if config == "Qwen3_5Config":  # text fields nested in text_config
        cfg_obj = transformers.Qwen3_5Config(text_config={"num_hidden_layers": 8, **kwargs})
    else:
        cfg_obj = getattr(transformers, config)(num_hidden_layers=8, **kwargs)
    cfg = {**cfg_obj.to_dict(), "architectures": [arch]}
    if config == "Qwen3NextConfig":
        cfg.pop("layer_types", None)  # from full_attention_interval instead
    ckpt_dir = tmp_path / "m"
    ckpt_dir.mkdir()
    (ckpt_dir / "config.json").write_text(json.dumps(cfg, default=str))
    (ckpt_dir / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    save_file({"x": np.zeros(1, np.float32)}, str(ckpt_dir / "model.safetensors"))
    return open_checkpoint(ckpt_dir)


@pytest.mark.parametrize(("config", "arch"), [
    ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
    ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
])
def test_hybrid_traits_from_real_configs(tmp_path, config, arch):
    """Real transformers 5.24 configs (8 layers: layer_types, or the interval of 4): the
    layer kinds, GDN shapes and partial rotary are read from them, and the weight list
    names the checkpoint's own tensors (here all missing)."""
    from ninfer.frontend.hybrid import hybrid_traits

    ckpt = _real_config_checkpoint(
        tmp_path, config, arch, **({"mlp_only_layers": list(range(8))}
                                   if config == "Qwen3NextConfig" else {}))
    t = hybrid_traits(ckpt.config)
    assert t.layer_types == ("linear_attention",) * 3 + ("full_attention",) + (
        "linear_attention",) * 3 + ("full_attention",)
    assert t.linear_layers == (0, 1, 2, 4, 5, 6) and t.attention_layers == (3, 7)
    assert t.rotary == ckpt.config.head_dim * 0.25
    assert t.fused_projections == (arch == "Qwen3NextForCausalLM")
    fused = "in_proj_qkvz" if t.fused_projections else "in_proj_qkv"
    with pytest.raises(FrontendError, match=r"missing tensor\(s\) .*model.embed_tokens.weight, "
                       r"model.layers.0.input_layernorm.weight, model.layers.0.linear_attn.A_log"):
        build_graph(ckpt)
    from ninfer.frontend.hybrid import hybrid_weights

    names = {s for w in hybrid_weights(ckpt.config, t, "model.") for s in w.sources}
    assert f"model.layers.0.linear_attn.{fused}.weight" in names
    assert "model.layers.3.self_attn.q_proj.weight" in names


@pytest.mark.parametrize(("config", "arch", "sparse"), [
    ("Qwen3NextConfig", "Qwen3NextForCausalLM", (0, 1, 3, 4, 5, 6, 7)),
    ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", tuple(range(8))),
])
def test_sparse_moe_blocks_from_real_configs(tmp_path, config, arch, sparse):
    """Qwen3-Next (mlp_only_layers) and Qwen3.5-MoE (every layer sparse, no dense
    intermediate_size in its config): the sparse layers and the per-expert tensor names."""
    from ninfer.frontend.hybrid import hybrid_traits, hybrid_weights

    extra = {"mlp_only_layers": [2]} if config == "Qwen3NextConfig" else {}
    ckpt = _real_config_checkpoint(tmp_path, config, arch, num_experts=8,
                                   num_experts_per_tok=2, **extra)
    t = hybrid_traits(ckpt.config)
    assert t.sparse_layers == sparse and t.experts == 8 and t.norm_topk
    assert t.dense_mlp == (config == "Qwen3NextConfig")
    names = {s for w in hybrid_weights(ckpt.config, t, "model.") for s in w.sources}
    assert {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.7.up_proj.weight",
            "model.layers.0.mlp.shared_expert_gate.weight"} <= names
    fused = {s for w in hybrid_weights(ckpt.config, t, "model.", fused_experts=True)
             for s in w.sources}
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused


def test_partial_rotary_on_a_dense_architecture_is_refused(tmp_path):
    import transformers

    cfg = {**transformers.Qwen3Config(num_hidden_layers=1).to_dict(),
           "architectures": ["Qwen3ForCausalLM"], "partial_rotary_factor": 0.5}
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg, default=str))
    (d / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    save_file({"x": np.zeros(1, np.float32)}, str(d / "model.safetensors"))
    with pytest.raises(FrontendError, match=r"partial_rotary_factor 0\.5 is not supported"):
        build_graph(open_checkpoint(d))


def test_load_index_reads_one_slice_of_every_float_dtype(tmp_path):
    """Checkpoint.load_index (one expert of a fused tensor) gives tensor[i] widened to f32,
    for F32, F16 and BF16 payloads, and refuses an index off the first axis."""
    import torch
    from safetensors.torch import save_file as save_torch

    from ninfer.frontend.checkpoint import Checkpoint, TensorInfo

    x = torch.randn(3, 2, 5)
    tensors = {"f32": x, "f16": x.half(), "bf16": x.bfloat16()}
    save_torch(tensors, str(tmp_path / "t.safetensors"))
    infos = {n: TensorInfo(n, tmp_path / "t.safetensors", tuple(t.shape),
                           {"f32": "F32", "f16": "F16", "bf16": "BF16"}[n])
             for n, t in tensors.items()}
    ckpt = Checkpoint(tmp_path, None, {}, infos, {}, {}, {})  # type: ignore[arg-type]
    for name, t in tensors.items():
        for i in range(3):
            np.testing.assert_array_equal(ckpt.load_index(name, i), t[i].float().numpy())
    with pytest.raises(FrontendError, match="index 3 outside"):
        ckpt.load_index("f16", 3)
