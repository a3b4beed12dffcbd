"""MTP speculative decoding on a tiny hybrid trained with its multi-token-prediction head:
acceptance per draft position and decode speed against plain decoding.

    .venv/bin/python benchmarks/bench_mtp.py --threads 2 --rounds 3

The model: a Qwen3.5-shaped hybrid (transformers' Qwen3_5ForCausalLM: 3 Gated DeltaNet
layers and one gated full-attention layer, hidden 128, tied embeddings, the demo
tokenizer) with an MTP head as Qwen3.5 checkpoints hold it (`mtp.fc` over
[RMSNorm(embed(t+1)); RMSNorm(h_t)], one full-attention decoder layer, `mtp.norm`, the
shared LM head), trained together here (torch, one CPU thread, --steps AdamW steps of 8
conversations): the model's loss on the next token plus --mtp-weight times the head's
loss on the token after it. The conversations are bench_spec.py's copy-heavy chat turns
(repeat, summarise, rename); cached under build/bench/mtp-copy.

It is compiled once with `--spec mtp --max-draft-tokens K`; the same server runs with
`--spec none` and with MTP drafts, alternating round by round, over held-out prompts,
greedy, one request at a time. Decode rate = completion tokens / decode time from the
server's timings. Printed: both rates per kind and overall, their ratio, drafts accepted
per position (ninfer:spec_decode_num_accepted_tokens_per_pos_total), and exact answers
(with drafts the tokens are plain decoding's by construction: the counts must agree).

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import time
from pathlib import Path
from typing import Any

import bench_spec

SEED = 5


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts per kind")
    p.add_argument("--draft-tokens", type=int, default=3)
    p.add_argument("--examples", type=int, default=2400, help="training conversations")
    p.add_argument("--steps", type=int, default=600, help="training steps (batch 8)")
    p.add_argument("--mtp-weight", type=float, default=0.5)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--inflate-ffn", type=int, default=0, metavar="N",
                   help="widen every MLP (the head's too: a checkpoint's MTP layer has the "
                        "model's width) to N columns of ~1e-6 output weight "
                        "(bench_spec.inflate_ffn)")
    return p.parse_args()


def _config(vocab: int, facts: dict[str, Any]) -> Any:
    import transformers

    return transformers.Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, tie_word_embeddings=True, rms_norm_eps=1e-6,
        max_position_embeddings=4096, bos_token_id=facts["bos_token_id"],
        eos_token_id=facts["eos_token_id"])


def train_model(directory: Path, examples: int, steps: int, mtp_weight: float) -> Path:
    """The trained hybrid with its MTP head (cached: a directory with its stamp is reused)."""
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    from ninfer.demo import chat_templates, train
    from ninfer.demo.checkpoint import write_tokenizer_files

    source = inspect.getsource(train_model) + inspect.getsource(_config) + inspect.getsource(
        bench_spec.tasks) + inspect.getsource(bench_spec._task)
    stamp = {"examples": examples, "steps": steps, "mtp_weight": mtp_weight, "seed": SEED,
             "torch": torch.__version__, "transformers": transformers.__version__,
             "source": hashlib.sha256(source.encode()).hexdigest()}
    tmp = bench_spec.unless_cached(directory, stamp)
    if tmp is None:
        return directory
    facts = write_tokenizer_files(tmp, "qwen")
    vocab = (facts["vocab_size"] + 63) // 64 * 64
    cfg = _config(vocab, facts)
    tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    eos, pad = tok.token_to_id(chat_templates.QWEN_EOS), tok.token_to_id("<|endoftext|>")
    convs = [[{"role": "user", "content": q}, {"role": "assistant", "content": a}]
             for _, q, a in bench_spec.tasks(bench_spec.TRAIN_SEED, examples // 3)]
    data = train.examples(convs, chat_templates.DEMO_TRAIN_TEMPLATE,
                          lambda text: tok.encode(text).ids, eos)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = transformers.Qwen3_5ForCausalLM(cfg)
    head_cfg = copy.deepcopy(cfg)
    head_cfg.num_hidden_layers, head_cfg.layer_types = 1, ["full_attention"]
    head = transformers.Qwen3_5TextModel(head_cfg)
    head.embed_tokens.weight.requires_grad_(False)  # not part of the head: the model's
    H = cfg.hidden_size
    fc = torch.nn.Linear(2 * H, H, bias=False)
    norm_e, norm_h = Qwen3_5RMSNorm(H, cfg.rms_norm_eps), Qwen3_5RMSNorm(H, cfg.rms_norm_eps)
    params = [p for m in (model, head, fc, norm_e, norm_h) for p in m.parameters()
              if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps,
                                                pct_start=0.05)
    gen = torch.Generator().manual_seed(SEED)
    t0 = time.time()
    seen = [0.0, 0.0, 0]
    try:
        for step in range(steps):
            batch = [data[int(i)] for i in torch.randint(len(data), (8,), generator=gen)]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            at1 = torch.zeros((len(batch), width), dtype=torch.bool)
            at2 = torch.zeros((len(batch), width - 1), dtype=torch.bool)
            for r, (seq, mask) in enumerate(batch):
                ids[r, :len(seq)] = torch.tensor(seq)
                for c in range(len(seq) - 1):
                    at1[r, c] = mask[c + 1]
                    if c + 2 < len(seq):
                        at2[r, c] = mask[c + 2]
            hidden = model.model(input_ids=ids).last_hidden_state  # final-normed
            loss1 = F.cross_entropy(model.lm_head(hidden[at1]), ids[:, 1:][at1[:, :-1]])
            # The head's row c pairs the hidden state at c with the token at c + 1 and
            # predicts the token at c + 2.
            x = fc(torch.cat([norm_e(model.model.embed_tokens(ids[:, 1:])),
                              norm_h(hidden[:, :-1])], dim=-1))
            out = head(inputs_embeds=x).last_hidden_state
            loss2 = F.cross_entropy(model.lm_head(out[at2]), ids[:, 2:][at2[:, :-1]])
            opt.zero_grad()
            (loss1 + mtp_weight * loss2).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            seen[0] += float(loss1.detach())
            seen[1] += float(loss2.detach())
            seen[2] += 1
            if (step + 1) % 100 == 0 or step + 1 == steps:
                print(f"  train: step {step + 1}/{steps}: loss {seen[0] / seen[2]:.3f}, "
                      f"MTP head {seen[1] / seen[2]:.3f} ({time.time() - t0:.0f} s)",
                      flush=True)
                seen = [0.0, 0.0, 0]
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(tmp)
    path = tmp / "model.safetensors"
    tensors = load_file(path)
    extra = {f"mtp.{k}": v for k, v in head.state_dict().items()
             if not k.startswith("embed_tokens")}
    extra |= {"mtp.fc.weight": fc.weight, "mtp.pre_fc_norm_embedding.weight": norm_e.weight,
              "mtp.pre_fc_norm_hidden.weight": norm_h.weight}
    save_file({**tensors, **{k: v.detach().contiguous() for k, v in extra.items()}}, path,
              metadata={"format": "pt"})
    return bench_spec.seal(tmp, directory, stamp)


def main() -> None:
    args = _parse()
    from ninfer.paths import DEFAULT_BUILD_DIR
    from ninfer.pipeline import CompileOptions, compile_model

    base = DEFAULT_BUILD_DIR / "bench"
    ckpt = train_model(base / "mtp-copy", args.examples, args.steps, args.mtp_weight)
    name = "mtp-copy"
    if args.inflate_ffn:
        name = f"mtp-copy-ffn{args.inflate_ffn}"
        ckpt = bench_spec.inflate_ffn(ckpt, base / name, args.inflate_ffn)
    out = base / f"{name}-cpu"
    compile_model(CompileOptions(model_dir=ckpt, out_dir=out, model_id=name,
                                 max_context=1024, prefill_chunk=256, max_concurrency=1,
                                 spec="mtp", max_draft_tokens=args.draft_tokens,
                                 kv_dtype="f16", python_module=False))
    held = bench_spec.tasks(bench_spec.TEST_SEED, args.prompts)
    prompts = [bench_spec._prompt_text(q) for _, q, _ in held]
    sides = ("plain", "mtp")
    tally = bench_spec.Tally(held, sides)
    accept_line = ""
    for rnd in range(args.rounds):
        for side in sides:
            res, metrics = bench_spec.ninfer_round(out, "none" if side == "plain" else "mtp",
                                                   prompts, args.threads, args.max_tokens)
            items = bench_spec.response_items(res)
            if side == "mtp":
                t = [r["timings"] for r in res]
                d, a = sum(x["draft_n"] for x in t), sum(x["draft_accepted_n"] for x in t)
                tokens = sum(n for _, n, _ in items)
                pos = [metrics.value("ninfer:spec_decode_num_accepted_tokens_per_pos_total",
                                     position=str(i)) for i in range(args.draft_tokens)]
                drafts = metrics.value("ninfer:spec_decode_num_drafts_total")
                accept_line = (f"{tokens} tokens, {d} drafts, {a} accepted "
                               f"({100 * a / max(d, 1):.0f}%); accepted per draft chain at "
                               "position 1..K " + " ".join(
                                   f"{v / max(drafts, 1):.2f}" for v in pos))
            tally.add(side, items)
        print(tally.round_line(rnd), flush=True)
    print(tally.table(args))
    plain, spec = tally.median("plain"), tally.median("mtp")
    print(f"ninfer MTP / plain: {spec / plain:.2f}x; {accept_line}")


if __name__ == "__main__":
    main()
