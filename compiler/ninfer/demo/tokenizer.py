"""Deterministic byte-level BPE tokenizers for tests and the demo checkpoint (no downloads).

`make_tokenizer(style, vocab_size)` trains a Hugging Face `tokenizers` BPE on a corpus generated
here (English prose, Python/C code, numbers, CJK, emoji, accented and combining characters,
whitespace runs) and returns the parsed tokenizer.json. The result is byte-identical run to
run. Styles mirror the real tokenizers' structure:

- "qwen" (Qwen2/Qwen3): NFC normalizer, Split(Qwen pattern, Isolated) + ByteLevel(use_regex=
  False) pre-tokenizer, ByteLevel post-processor and decoder; added tokens `<|endoftext|>`,
  `<|im_start|>`, `<|im_end|>` (special) and `<think>`, `</think>` (not special, as in Qwen3).
- "llama3": no normalizer, Split(Llama-3 pattern) + ByteLevel, `ignore_merges`, a
  TemplateProcessing post-processor prepending `<|begin_of_text|>`, ByteLevel decoder; special
  tokens `<|begin_of_text|>`, `<|end_of_text|>`, `<|start_header_id|>`, `<|end_header_id|>`,
  `<|eot_id|>`.

The BPE vocabulary gets `vocab_size - len(added tokens)` entries and the added tokens take the
ids after it (like the real models), so ids span exactly `range(vocab_size)`.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any, Literal

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

Style = Literal["qwen", "llama3"]

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_NOT_SPECIAL = ("<think>", "</think>")
LLAMA3_SPECIAL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
CORPUS_SEED = 20240601
CORPUS_PARAGRAPHS = 2400

_WORDS = (
    "the of and to in is was for on that with as by at from his her they this which be or an "
    "are not have had has but were one all their there been if more when will would who so no "
    "time people year way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education tokenizer compiler server model token kernel tensor cache request batch latency"
).split()
_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
_CJK = (
    "的一是不了人我在有他这中大来上个国和也子时道出要于就下得可你年生自会那后能对着事其里所去行过"
    "家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
    "模型服务器编译推理令牌缓存请求批处理延迟"
)
_KANA = (
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
)
_KATAKANA = (
    "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲン"
)
_HANGUL = "한국어토큰화모델서버컴파일러요청응답안녕하세요감사합니다"
_EMOJI = (
    "😀", "😂", "🥲", "😍", "🤔", "🙃", "🎉", "🚀", "🔥", "✨", "❤️", "👍", "👍🏽", "👋🏻", "🙏🏿",
    "👨‍👩‍👧", "👩‍💻", "🏳️‍🌈", "🇺🇸", "🇯🇵", "🤷‍♀️", "🧑🏾‍🚀", "☕", "🍕", "✅", "❌",
)  # fmt: skip
_ACCENTED = (
    "café", "naïve", "résumé", "Ångström", "Zürich", "façade", "coöperate", "jalapeño", "São Paulo",
    "Dvořák", "Łódź", "Ελληνικά", "Привет", "straße", "ﬁnance", "Å", "ǅ", "ṩ", "ệ", "Ωmega",
)  # fmt: skip
_COMBINING = ("\u0301", "\u0300", "\u0308", "\u0327", "\u0323", "\u0302", "\u030a", "\u0303")
_CODE_NAMES = ("value", "count", "items", "result", "buffer", "index", "tokens", "state", "x", "y")


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
    if rng.random() < 0.4:
        i = rng.randrange(len(words))
        words[i] += rng.choice(_CONTRACTIONS)
    if rng.random() < 0.1:
        words = [w.upper() for w in words]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(".!?,;:") + rng.choice(("", " ", "  "))


def _prose(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))


def _python_code(rng: random.Random) -> str:
    name, arg = rng.choice(_CODE_NAMES), rng.choice(_CODE_NAMES)
    body = [
        f"def get_{name}({arg}: list[int], limit: int = {rng.randint(0, 999)}) -> int:",
        f'    """Return the {name} of {arg}."""',
        "    total = 0",
        f"    for i, item in enumerate({arg}):",
        f"        if item % {rng.randint(2, 9)} == 0 and i < limit:",
        f"            total += item * {rng.random():.3f}",
        "        elif item is None:",
        "\t\tcontinue",
        f"    return total  # {rng.choice(_WORDS)}",
    ]
    return "\n".join(body) + "\n"


def _c_code(rng: random.Random) -> str:
    name = rng.choice(_CODE_NAMES)
    return (
        f"static int {name}_sum(const int *{name}, size_t n) {{\n"
        f"  int acc = 0;\r\n"
        f"  for (size_t i = 0; i < n; ++i) {{ acc += {name}[i] << {rng.randint(0, 7)}; }}\n"
        f'  printf("%d\\n", acc);\n'
        f"  return acc != 0 ? acc : -{rng.randint(1, 99)};\n}}\n"
    )


def _numbers(rng: random.Random) -> str:
    parts = [
        str(rng.randint(0, 10 ** rng.randint(1, 12))),
        f"{rng.uniform(-1e4, 1e4):.{rng.randint(0, 6)}f}",
        f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        f"+1 ({rng.randint(200, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
        f"{rng.randint(0, 100)}% of {rng.randint(1, 10**6):,}",
        "".join(rng.choice("0123456789") for _ in range(rng.randint(5, 30))),
    ]
    rng.shuffle(parts)
    return " ".join(parts)


def _cjk(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(2, 5)):
        alphabet = rng.choice((_CJK, _CJK, _KANA, _KATAKANA, _HANGUL))
        pieces.append("".join(rng.choice(alphabet) for _ in range(rng.randint(2, 12))))
        pieces.append(rng.choice(("\u3002", "\u3001", "\uff0c", "\uff01", "\uff1f", " ", "")))
    return "".join(pieces)


def _emoji(rng: random.Random) -> str:
    return " ".join(
        rng.choice(_EMOJI) * rng.randint(1, 3) if rng.random() < 0.5 else rng.choice(_WORDS)
        for _ in range(rng.randint(3, 10))
    )


def _accents(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(3, 10)):
        word = rng.choice(_ACCENTED)
        if rng.random() < 0.3:  # decomposed or stacked combining marks
            word = rng.choice(("e", "a", "o", "n", "u")) + "".join(
                rng.choice(_COMBINING) for _ in range(rng.randint(1, 3))
            )
        words.append(word)
    return " ".join(words)


def _whitespace(rng: random.Random) -> str:
    runs = (" " * rng.randint(2, 8), "\t" * rng.randint(1, 3), "\n" * rng.randint(1, 3), "\r\n")
    return "".join(rng.choice(_WORDS) + rng.choice(runs) for _ in range(rng.randint(3, 8)))


_GENERATORS = (
    (_prose, 8),
    (_python_code, 2),
    (_c_code, 1),
    (_numbers, 2),
    (_cjk, 2),
    (_emoji, 1),
    (_accents, 1),
    (_whitespace, 1),
)


def corpus(seed: int = CORPUS_SEED, paragraphs: int = CORPUS_PARAGRAPHS) -> list[str]:
    """The training corpus: `paragraphs` texts drawn from every generator (a few hundred KB)."""
    rng = random.Random(seed)
    funcs = [f for f, weight in _GENERATORS for _ in range(weight)]
    return [rng.choice(funcs)(rng) for _ in range(paragraphs)]


def _added_tokens(style: Style) -> list[AddedToken]:
    if style == "qwen":
        special = [AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL]
        plain = [AddedToken(t, special=False, normalized=False) for t in QWEN_NOT_SPECIAL]
        return special + plain
    return [AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL]


def _configure(tok: Tokenizer, style: Style) -> None:
    pattern = QWEN_PATTERN if style == "qwen" else LLAMA3_PATTERN
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    if style == "qwen":
        tok.normalizer = normalizers.NFC()


@functools.lru_cache(maxsize=8)
def _tokenizer_json(style: Style, vocab_size: int, extra: tuple[str, ...] = ()) -> str:
    if style not in ("qwen", "llama3"):
        raise ValueError(f"unknown tokenizer style {style!r} (expected 'qwen' or 'llama3')")
    added = _added_tokens(style)
    bpe_size = vocab_size - len(added)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if bpe_size < len(alphabet):
        raise ValueError(f"vocab_size {vocab_size} is below the byte alphabet plus added tokens")
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    _configure(tok, style)
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=alphabet,
    )
    tok.train_from_iterator([*corpus(), *extra], trainer=trainer)
    if tok.get_vocab_size() != bpe_size:
        raise ValueError(
            f"the demo corpus yields only {tok.get_vocab_size()} BPE tokens; "
            f"vocab_size {vocab_size} needs {bpe_size}"
        )
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])
    if style == "qwen":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        bos = LLAMA3_SPECIAL[0]
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A:0",
                    pair=f"{bos} $A:0 {bos}:1 $B:1",
                    special_tokens=[(bos, tok.token_to_id(bos))],
                ),
            ]
        )
    data = json.loads(tok.to_str())
    if style == "llama3":
        data["model"]["ignore_merges"] = True
    return json.dumps(data, ensure_ascii=False)


def make_tokenizer(style: Style, vocab_size: int = 2048,
                   extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The parsed tokenizer.json of a deterministic demo tokenizer (a fresh dict per call).
    `extra`: more training texts after the generated corpus (the demo model's tokenizer
    adds its conversations, so that their words are whole tokens)."""
    return json.loads(_tokenizer_json(style, vocab_size, extra))


def save_tokenizer(style: Style, directory: str | Path, vocab_size: int = 2048) -> Path:
    """Write `directory`/tokenizer.json (only that file) and return its path."""
    path = Path(directory) / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(make_tokenizer(style, vocab_size), ensure_ascii=False))
    return path
