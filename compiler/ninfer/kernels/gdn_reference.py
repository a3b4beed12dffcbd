"""float64 numpy reference of a Gated DeltaNet layer (Qwen3.5 / Qwen3-Next linear attention).

The math is that of transformers 5.24's `Qwen3_5GatedDeltaNet` (`../shared/HYBRID_NOTES.md`
gathers it): per token t and value head h, with key head h // (Hv / Hk),

    x = [q | k | v] = SiLU(causal depthwise conv1d(in_proj_qkv(h_t)))   (kernel K, no bias)
    beta = sigmoid(in_proj_b(h_t)),  g = -exp(A_log) * softplus(in_proj_a(h_t) + dt_bias)
    q, k L2-normalised over dk (1 / sqrt(sum + 1e-6)), q scaled by dk^-1/2
    S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T q_t
    out = out_proj(RMSNorm_dv(o) * norm.weight * SiLU(z)),  z = in_proj_z(h_t)

with S [dk, dv] per value head. `delta_rule_recurrent` is the token-by-token form (decode),
`delta_rule_chunked` the chunked one (prefill): within a chunk with cumulative log-decay G,
A_jl = beta_j exp(G_j - G_l) k_j . k_l (l < j), T = (I + A)^-1, U = T diag(beta) V,
W = T diag(beta exp(G)) K, the chunk's deltas D = U - W S0, its outputs
O = exp(G) (Q S0) + lower_incl(exp(G_i - G_j) Q K^T) D and its last state
exp(G_L) S0 + (exp(G_L - G) K)^T D. The two forms agree to rounding on any input, and a
sequence cut anywhere into calls that carry (conv_state, ssm_state) gives the same outputs
as one call: the properties the kernels are tested against.

`hybrid_logits` runs a whole Qwen3.5 (dense or MoE) / Qwen3-Next text model (Gated
DeltaNet and gated full-attention layers per `layer_types`, zero-centred norms, partial
rotary, sparse MoE blocks with a gated shared expert) from its checkpoint tensors: the
float64 parity reference of the hybrid frontend. `mtp_hidden` / `mtp_drafts` run the
checkpoints' multi-token-prediction head (`mtp.*`) and its chained greedy drafts: the
reference of MTP speculative decoding (checked against the same head assembled from
transformers' Qwen3.5 modules, which do not run it themselves).

Shapes: tokens first, no batch (one sequence). States: conv [K - 1, conv_dim] (the last
K - 1 inputs of the conv, oldest first), ssm [Hv, dk, dv].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ninfer.frontend.hybrid import split_gated_query as split_gated_query  # re-exported
from ninfer.frontend.hybrid import split_qkvz

EPS_L2 = 1e-6


@dataclass(frozen=True)
class GdnDims:
    hidden: int
    k_heads: int  # linear_num_key_heads
    v_heads: int  # linear_num_value_heads
    k_dim: int  # linear_key_head_dim
    v_dim: int  # linear_value_head_dim
    conv_kernel: int  # linear_conv_kernel_dim
    eps: float = 1e-6  # rms_norm_eps of the gated norm

    def __post_init__(self) -> None:
        if self.v_heads % self.k_heads:
            raise ValueError(f"linear_num_value_heads {self.v_heads} is not a multiple of "
                             f"linear_num_key_heads {self.k_heads}")

    @property
    def key_width(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_width(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_width + self.value_width


@dataclass
class GdnState:
    conv: np.ndarray  # [K - 1, conv_dim]
    ssm: np.ndarray  # [Hv, dk, dv]

    @staticmethod
    def zeros(d: GdnDims) -> GdnState:
        return GdnState(np.zeros((d.conv_kernel - 1, d.conv_dim)),
                        np.zeros((d.v_heads, d.k_dim, d.v_dim)))


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def causal_conv1d(x: np.ndarray, weight: np.ndarray,
                  state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SiLU(depthwise causal conv1d) of x [T, C] with weight [C, K] (or [C, 1, K]), after
    the K - 1 carried inputs `state` [K - 1, C]; returns (y [T, C], the new state)."""
    w = _f64(weight).reshape(weight.shape[0], -1)
    K = w.shape[1]
    full = np.concatenate([_f64(state), _f64(x)], axis=0)  # [K - 1 + T, C]
    T = x.shape[0]
    y = np.zeros((T, w.shape[0]))
    for j in range(K):  # tap j multiplies the input K - 1 - j steps back
        y += full[j:j + T] * w[:, j]
    return silu(y), full[T:] if K > 1 else full[:0]


def gating(a: np.ndarray, b: np.ndarray, A_log: np.ndarray,
           dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(g, beta) [T, Hv]: g = -exp(A_log) softplus(a + dt_bias) (log-decay), beta = sigmoid(b)."""
    g = -np.exp(_f64(A_log)) * softplus(_f64(a) + _f64(dt_bias))
    beta = 1.0 / (1.0 + np.exp(-_f64(b)))
    return g, beta


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + EPS_L2)


def _heads(q: np.ndarray, k: np.ndarray, v_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalised, scaled queries and normalised keys, key heads repeated to value heads."""
    r = v_heads // q.shape[1]
    q = l2norm(_f64(q)) * q.shape[-1] ** -0.5
    k = l2norm(_f64(k))
    return np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)


def delta_rule_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                         beta: np.ndarray, ssm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token by token. q, k [T, Hk, dk] (raw: normalised here), v [T, Hv, dv], g, beta
    [T, Hv], ssm [Hv, dk, dv]; returns (o [T, Hv, dv], the new ssm)."""
    q, k = _heads(q, k, v.shape[1])
    v = _f64(v)
    S = _f64(ssm).copy()
    out = np.zeros_like(v)
    for t in range(v.shape[0]):
        S *= np.exp(g[t])[:, None, None]
        mem = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - mem) * beta[t][:, None]
        S += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    return out, S


def delta_rule_chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                       beta: np.ndarray, ssm: np.ndarray,
                       chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The same as delta_rule_recurrent, in chunks of `chunk` tokens (the last one shorter)."""
    q, k = _heads(q, k, v.shape[1])
    v, g, beta = _f64(v), _f64(g), _f64(beta)
    S = _f64(ssm).copy()
    T, H, _ = v.shape
    out = np.zeros_like(v)
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        for h in range(H):
            Q, Kc, V = q[sl, h], k[sl, h], v[sl, h]
            G = np.cumsum(g[sl, h])
            bt = beta[sl, h]
            L = len(G)
            # exp(G_i - G_j) for j <= i, else 0 (masked before the exp: G_i - G_j > 0 there)
            causal = np.tril(np.ones((L, L), dtype=bool))
            decay = np.exp(np.where(causal, G[:, None] - G[None, :], -np.inf))
            A = bt[:, None] * decay * (Kc @ Kc.T) * np.tril(np.ones((L, L)), -1)
            Tm = np.linalg.inv(np.eye(L) + A)
            U = Tm @ (bt[:, None] * V)
            W = Tm @ ((bt * np.exp(G))[:, None] * Kc)
            D = U - W @ S[h]
            attn = (Q @ Kc.T) * decay
            out[sl, h] = np.exp(G)[:, None] * (Q @ S[h]) + attn @ D
            S[h] = np.exp(G[-1]) * S[h] + (np.exp(G[-1] - G)[:, None] * Kc).T @ D
    return out, S


def gated_rmsnorm(o: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis with a plain weight (not 1 + w), times SiLU(z)."""
    o = _f64(o)
    return o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps) * _f64(weight) * silu(
        _f64(z))


def gdn_layer(x: np.ndarray, w: dict[str, np.ndarray], d: GdnDims, state: GdnState,
              chunked: bool = True) -> tuple[np.ndarray, GdnState]:
    """One Gated DeltaNet layer on x [T, hidden] from `state`, weights under Qwen3.5's names
    (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` as [out, in], `conv1d`,
    `dt_bias`, `A_log`, `norm`, `out_proj`; Qwen3-Next's fused projections go through
    `split_fused_projections` first). Returns (out [T, hidden], the new state)."""
    x = _f64(x)
    T = x.shape[0]
    mixed, conv = causal_conv1d(x @ _f64(w["in_proj_qkv"]).T, w["conv1d"], state.conv)
    kw = d.key_width
    q = mixed[:, :kw].reshape(T, d.k_heads, d.k_dim)
    k = mixed[:, kw:2 * kw].reshape(T, d.k_heads, d.k_dim)
    v = mixed[:, 2 * kw:].reshape(T, d.v_heads, d.v_dim)
    g, beta = gating(x @ _f64(w["in_proj_a"]).T, x @ _f64(w["in_proj_b"]).T, w["A_log"],
                     w["dt_bias"])
    rule = delta_rule_chunked if chunked else delta_rule_recurrent
    o, ssm = rule(q, k, v, g, beta, state.ssm)
    z = (x @ _f64(w["in_proj_z"]).T).reshape(T, d.v_heads, d.v_dim)
    o = gated_rmsnorm(o, z, w["norm"], d.eps).reshape(T, d.value_width)
    return o @ _f64(w["out_proj"]).T, GdnState(conv, ssm)


def split_fused_projections(qkvz: np.ndarray, ba: np.ndarray,
                            d: GdnDims) -> dict[str, np.ndarray]:
    """Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba` as Qwen3.5's four projections
    (the frontend's own regrouping, frontend.hybrid.split_qkvz)."""
    return split_qkvz(qkvz, ba, d.k_heads, d.v_heads, d.k_dim, d.v_dim)


# ---- whole dense hybrid model (Qwen3.5 text): the parity reference of the frontend ----


def zero_centred_rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3.5 / Qwen3-Next norms: x / rms(x) * (1 + w), w initialised to 0."""
    x = _f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + _f64(weight))


def _rotate(x: np.ndarray, pos: np.ndarray, rotary: int, theta: float) -> np.ndarray:
    """Rotate-half rotary embedding on the first `rotary` dims of x [T, heads, hd]."""
    inv = 1.0 / theta ** (np.arange(0, rotary, 2, dtype=np.float64) / rotary)
    freqs = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.concatenate([np.cos(freqs)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(freqs)] * 2, axis=-1)[:, None, :]
    r, rest = x[..., :rotary], x[..., rotary:]
    half = rotary // 2
    rot = np.concatenate([-r[..., half:], r[..., :half]], axis=-1)
    return np.concatenate([r * cos + rot * sin, rest], axis=-1)


def gated_attention(x: np.ndarray, w: dict[str, np.ndarray], cfg: dict,
                    pos: np.ndarray) -> np.ndarray:
    """Qwen3.5's full-attention layer on x [T, hidden] (causal over the T tokens, positions
    `pos`): q_proj gives [query | gate] per head, zero-centred q/k norms, partial rotary,
    output o_proj(attn * sigmoid(gate))."""
    T = x.shape[0]
    H, KVH, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rotary = int(hd * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    qg = (x @ _f64(w["q_proj"]).T).reshape(T, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
    q = _rotate(zero_centred_rmsnorm(q, w["q_norm"], eps), pos, rotary, theta)
    k = (x @ _f64(w["k_proj"]).T).reshape(T, KVH, hd)
    k = _rotate(zero_centred_rmsnorm(k, w["k_norm"], eps), pos, rotary, theta)
    v = (x @ _f64(w["v_proj"]).T).reshape(T, KVH, hd)
    rep = H // KVH
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * hd ** -0.5
    scores = np.where(np.tril(np.ones((T, T), dtype=bool))[None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", p, v).reshape(T, H * hd)
    return (o * (1.0 / (1.0 + np.exp(-gate)))) @ _f64(w["o_proj"]).T


def layer_types(cfg: dict) -> list[str]:
    """`layer_types`, else every `full_attention_interval`-th layer (default 4) is full
    attention and the others linear (Gated DeltaNet)."""
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    every = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention"
            for i in range(cfg["num_hidden_layers"])]


def dims_of(cfg: dict) -> GdnDims:
    return GdnDims(cfg["hidden_size"], cfg["linear_num_key_heads"],
                   cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                   cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"],
                   cfg["rms_norm_eps"])


def _mlp(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    return (silu(x @ _f64(gate).T) * (x @ _f64(up).T)) @ _f64(down).T


def _experts(m: dict[str, np.ndarray], count: int) -> list[tuple[np.ndarray, ...]]:
    """(gate, up, down) per expert, from per-expert checkpoint tensors
    (`experts.{e}.gate_proj` ...) or transformers' fused `experts.gate_up_proj` [E, 2I, H]
    and `experts.down_proj` [E, H, I]."""
    if "experts.gate_up_proj" in m:
        gu, down = _f64(m["experts.gate_up_proj"]), _f64(m["experts.down_proj"])
        inter = gu.shape[1] // 2
        return [(gu[e, :inter], gu[e, inter:], down[e]) for e in range(count)]
    return [(m[f"experts.{e}.gate_proj"], m[f"experts.{e}.up_proj"], m[f"experts.{e}.down_proj"])
            for e in range(count)]


def moe_mlp(x: np.ndarray, m: dict[str, np.ndarray], cfg: dict) -> np.ndarray:
    """Qwen3-Next / Qwen3.5-MoE sparse block: p = softmax(router(x)), the top
    num_experts_per_tok experts (renormalised when norm_topk_prob) weighted by p, plus
    sigmoid(shared_expert_gate . x) * shared_expert(x)."""
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    logits = x @ _f64(m["gate"]).T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, top, axis=-1)
    if cfg.get("norm_topk_prob", True):
        weights = weights / weights.sum(-1, keepdims=True)
    experts = _experts(m, E)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, wt in zip(top[t], weights[t], strict=True):
            out[t] += wt * _mlp(x[t:t + 1], *experts[e])[0]
    shared = _mlp(x, m["shared_expert.gate_proj"], m["shared_expert.up_proj"],
                  m["shared_expert.down_proj"])
    gate = 1.0 / (1.0 + np.exp(-(x @ _f64(m["shared_expert_gate"]).T)))
    return out + gate * shared


def is_sparse_layer(cfg: dict, i: int) -> bool:
    """Whether layer i's MLP is the sparse MoE block (num_experts > 0, every
    decoder_sparse_step-th layer, not in mlp_only_layers)."""
    return (cfg.get("num_experts", 0) > 0 and i not in cfg.get("mlp_only_layers", [])
            and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def _weights_under(weights: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    n = len(prefix)
    return {k[n:].removesuffix(".weight"): v for k, v in weights.items() if k.startswith(prefix)}


def _decoder_layer(h: np.ndarray, weights: dict[str, np.ndarray], pre: str, kind: str,
                   sparse: bool, cfg: dict, pos: np.ndarray) -> np.ndarray:
    """One decoder layer (tensors under `pre`) on the residual stream h [T, hidden]."""
    eps = cfg["rms_norm_eps"]
    x = zero_centred_rmsnorm(h, weights[pre + "input_layernorm.weight"], eps)
    if kind == "linear_attention":
        d = dims_of(cfg)
        lw = _weights_under(weights, pre + "linear_attn.")
        if "in_proj_qkvz" in lw:
            lw |= split_fused_projections(lw.pop("in_proj_qkvz"), lw.pop("in_proj_ba"), d)
        y, _ = gdn_layer(x, lw, d, GdnState.zeros(d))
    else:
        y = gated_attention(x, _weights_under(weights, pre + "self_attn."), cfg, pos)
    h = h + y
    x = zero_centred_rmsnorm(h, weights[pre + "post_attention_layernorm.weight"], eps)
    m = _weights_under(weights, pre + "mlp.")
    if sparse:
        return h + moe_mlp(x, m, cfg)
    return h + _mlp(x, m["gate_proj"], m["up_proj"], m["down_proj"])


def hybrid_hidden(cfg: dict, weights: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """The final-normed hidden states [T, hidden] (what the LM head reads) of a Qwen3.5
    (dense or MoE) / Qwen3-Next text model (config.json's text fields, tensors under their
    checkpoint names without the `model.` / `model.language_model.` prefix, e.g.
    `layers.0.linear_attn.in_proj_qkv.weight`; Qwen3-Next's fused `in_proj_qkvz` /
    `in_proj_ba` are split here) on the prompt `ids`."""
    h = _f64(weights["embed_tokens.weight"])[np.asarray(ids)]
    pos = np.arange(len(ids))
    for i, kind in enumerate(layer_types(cfg)):
        h = _decoder_layer(h, weights, f"layers.{i}.", kind, is_sparse_layer(cfg, i), cfg, pos)
    return zero_centred_rmsnorm(h, weights["norm.weight"], cfg["rms_norm_eps"])


def lm_head(weights: dict[str, np.ndarray]) -> np.ndarray:
    return _f64(weights.get("lm_head.weight", weights["embed_tokens.weight"]))


def hybrid_logits(cfg: dict, weights: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Logits [T, vocab] of the model on the prompt `ids` (hybrid_hidden's tensors)."""
    return hybrid_hidden(cfg, weights, ids) @ lm_head(weights).T


def mtp_hidden(cfg: dict, weights: dict[str, np.ndarray], hidden: np.ndarray,
               next_ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The multi-token-prediction head of Qwen3.5 / Qwen3-Next checkpoints (`mtp.*`, as
    vLLM's qwen3_next_mtp runs it) over rows t, causal among them at positions `pos`:
    fc([RMSNorm_e(embed(next_ids[t])); RMSNorm_h(hidden[t])]) (the embedding first), one
    gated full-attention decoder layer (`mtp.layers.0.`, its MLP sparse when the model's
    are), `mtp.norm`; the LM head of the result predicts the token after next_ids[t].
    `hidden[t]` is the main model's final-normed hidden state at the position of the token
    before next_ids[t] (what its LM head read), or for a chained draft the previous row's
    result here. All its norms are zero-centred."""
    eps = cfg["rms_norm_eps"]
    e = zero_centred_rmsnorm(_f64(weights["embed_tokens.weight"])[np.asarray(next_ids)],
                             weights["mtp.pre_fc_norm_embedding.weight"], eps)
    h = zero_centred_rmsnorm(hidden, weights["mtp.pre_fc_norm_hidden.weight"], eps)
    x = np.concatenate([e, h], axis=1) @ _f64(weights["mtp.fc.weight"]).T
    sparse = "mtp.layers.0.mlp.gate.weight" in weights
    x = _decoder_layer(x, weights, "mtp.layers.0.", "full_attention", sparse, cfg,
                       np.asarray(pos))
    return zero_centred_rmsnorm(x, weights["mtp.norm.weight"], eps)


def mtp_drafts(cfg: dict, weights: dict[str, np.ndarray], ids: np.ndarray,
               k: int) -> tuple[int, list[int]]:
    """(the greedy next token t after prompt `ids`, the k greedy MTP drafts after it):
    the head's rows p = 0 .. T-1 pair the main hidden state at p with the token at p + 1
    (t for the last), and draft j + 1 comes from a row at position T - 1 + j that pairs the
    head's result of the row before with draft j (each row attends to the head's rows
    before it: its own KV)."""
    ids = np.asarray(ids)
    hidden = hybrid_hidden(cfg, weights, ids)
    head = lm_head(weights)
    t = int(np.argmax(hidden[-1] @ head.T))
    rows_h, rows_x = list(hidden), [*ids[1:].tolist(), t]
    drafts: list[int] = []
    for _ in range(k):
        out = mtp_hidden(cfg, weights, np.stack(rows_h), np.array(rows_x),
                         np.arange(len(rows_x)))
        drafts.append(int(np.argmax(out[-1] @ head.T)))
        rows_h.append(out[-1])
        rows_x.append(drafts[-1])
    return t, drafts
