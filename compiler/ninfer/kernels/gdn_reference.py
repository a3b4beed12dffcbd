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

Shapes: tokens first, no batch (one sequence). States: conv [K - 1, conv_dim] (the last
K - 1 inputs of the conv, oldest first), ssm [Hv, dk, dv].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    """Qwen3-Next's `in_proj_qkvz` [Hk * (2 dk + 2 r dv), hidden] and `in_proj_ba`
    [Hk * 2r, hidden] (rows grouped per key head: q, k, v, z and b, a, r = Hv / Hk) as
    Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`."""
    r = d.v_heads // d.k_heads
    per = 2 * d.k_dim + 2 * r * d.v_dim
    if qkvz.shape[0] != d.k_heads * per or ba.shape[0] != d.k_heads * 2 * r:
        raise ValueError(f"in_proj_qkvz {qkvz.shape} / in_proj_ba {ba.shape} do not match "
                         f"{d.k_heads} key heads of {per} and {2 * r} rows")
    g = qkvz.reshape(d.k_heads, per, -1)
    q, k = g[:, :d.k_dim], g[:, d.k_dim:2 * d.k_dim]
    v = g[:, 2 * d.k_dim:2 * d.k_dim + r * d.v_dim]
    z = g[:, 2 * d.k_dim + r * d.v_dim:]
    gb = ba.reshape(d.k_heads, 2 * r, -1)
    hidden = qkvz.shape[1]
    return {
        "in_proj_qkv": np.concatenate([q.reshape(-1, hidden), k.reshape(-1, hidden),
                                       v.reshape(-1, hidden)]),
        "in_proj_z": z.reshape(-1, hidden),
        "in_proj_b": gb[:, :r].reshape(-1, hidden),
        "in_proj_a": gb[:, r:].reshape(-1, hidden),
    }
