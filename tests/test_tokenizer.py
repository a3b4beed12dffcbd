"""The C++ tokenizer (runtime_cpp/text/tokenizer.h) against Hugging Face `tokenizers`.

Ids, decoded text and streamed text must be identical to HF for the demo tokenizers and for
variants exercising every supported component option.
"""

from __future__ import annotations

import copy
import json
import random
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Regex, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

import native_build
from ninfer.demo.tokenizer import LLAMA3_SPECIAL, QWEN_NOT_SPECIAL, QWEN_SPECIAL, make_tokenizer

pytestmark = pytest.mark.unit

STYLES = ("qwen", "llama3")


@pytest.fixture(scope="session")
def ext() -> Any:
    return native_build.extension("ninfer_tokenizer_ext")


@pytest.fixture(scope="session")
def tokenizer_json() -> dict[str, dict[str, Any]]:
    return {style: make_tokenizer(style) for style in STYLES}


def load(ext: Any, data: dict[str, Any]) -> tuple[Any, HFTokenizer]:
    text = json.dumps(data)
    return ext.Tokenizer(text), HFTokenizer.from_str(text)


# ---------------------------------------------------------------------------------------------
# Test strings


WORDS = "the quick brown fox jumps over lazy dog tokenizer server model hello world naïve".split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "'\u017f"]
CJK = "的一是不了人我在有他这中大来上个国和也子时道出要模型服务器编译推理あいうえおアイウエオ한국어"
EMOJI = [
    "😀", "👍🏽", "👋🏻", "🙏🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇺🇸", "🇯🇵", "🤷‍♀️", "🧑🏾‍🚀",
    "1️⃣", "❤️", "☕", "🫠", "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1",
]  # fmt: skip
COMBINING = ["\u0301", "\u0316", "\u0323", "\u0300", "\u0327", "\u031b", "\u0308", "\u0345"]
SPECIAL_CASES = [
    "\u212b", "\u2126", "\u0344", "\u0958", "\u1100\u1161\u11a8", "\uac00\u11a8", "\u0fb3\u0f81",
    "A\u030a", "e\u0301", "\u1e9b\u0323", "\u00c5\u0301", "\u0d46\u0d3e", "\U0001d15e",
    "\u0f73", "\u2adc", "\U00011938", "\U00011935\U00011930", "\u0898a\u0301\u0898",
]  # fmt: skip
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n ", "\u00a0", "\u3000", "\u2009",
          "\u0085", "\u2028", "\x0b", "\x0c", "\t\t  ", "    "]  # fmt: skip
DIGITS = "0123456789"
OTHER_NUMERALS = ["٣٤٥", "\uff11\uff12\uff13", "²³", "Ⅻ", "½", "߀߁", "໐໑"]
PUNCT = [
    "!!!",
    "...",
    "---",
    "«",
    "»",
    "“",
    "”",
    "()",
    "{}",
    "[]",
    "->",
    "==",
    "#",
    "@",
    "$%^",
    "\x00\x01\x7f",
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\r\n}",
    'print(f"{value!r:>10}")',
    "    if (ptr != NULL && *ptr == '\\0') return -1;",
    "SELECT * FROM users WHERE id=42;",
]


def _fragment(rng: random.Random) -> str:
    kind = rng.randrange(16)
    if kind == 0:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
    if kind == 1:
        word = rng.choice(WORDS)
        word = rng.choice((word, word.upper(), word.capitalize()))
        return word + rng.choice(CONTRACTIONS)
    if kind == 2:
        return "".join(rng.choice(CJK) for _ in range(rng.randint(1, 10)))
    if kind == 3:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 4:
        base = rng.choice("aeiouAEOnNcs\u0391\u1100 ")
        return base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 4)))
    if kind == 5:
        word = rng.choice(["café", "Ångström", "Zürich", "São Paulo", "Dvořák", "ệ", "ǅ"])
        return unicodedata.normalize(rng.choice(("NFC", "NFD", "NFKD")), word)
    if kind == 6:
        return rng.choice(SPECIAL_CASES)
    if kind == 7:
        return "".join(rng.choice(DIGITS) for _ in range(rng.randint(1, 25)))
    if kind == 8:
        return rng.choice(OTHER_NUMERALS)
    if kind == 9:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 4)))
    if kind == 10:
        return rng.choice(CODE)
    if kind == 11:
        return rng.choice(PUNCT)
    if kind == 12:
        tokens = [*QWEN_SPECIAL, *QWEN_NOT_SPECIAL, *LLAMA3_SPECIAL]
        token = rng.choice(tokens)
        return rng.choice((token, token, token[:-1], "<" + token, token + ">", token.upper()))
    if kind == 13:  # random code points from assorted blocks
        blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F),
                  (0xE00, 0xE7F), (0x2000, 0x2BFF), (0xE000, 0xE010), (0x1F300, 0x1FAFF),
                  (0x10000, 0x1007F), (0x1D400, 0x1D4FF)]  # fmt: skip
        lo, hi = rng.choice(blocks)
        return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6)))
    if kind == 14:
        return " " * rng.randint(1, 40)
    return rng.choice(WORDS).upper() + rng.choice(DIGITS) * rng.randint(1, 5)


def random_texts(seed: int = 1234, count: int = 1200) -> list[str]:
    rng = random.Random(seed)
    texts = ["", " ", "\n", "a", "\r\n", "   x", "x   ", "<|im_start|>", "<|begin_of_text|>"]
    while len(texts) < count:
        parts = [_fragment(rng) for _ in range(rng.randint(1, 8))]
        seps = ["", " ", "\n", "  ", "\t"]
        texts.append("".join(p + rng.choice(seps) for p in parts))
    return texts


TEXTS = random_texts()


def assert_same_ids(ours: Any, hf: HFTokenizer, texts: list[str], add_special: bool) -> None:
    mismatches = []
    for text in texts:
        got = ours.encode(text, add_special)
        want = hf.encode(text, add_special_tokens=add_special).ids
        if got != want:
            mismatches.append((text, got, want))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"


# ---------------------------------------------------------------------------------------------
# Demo tokenizers


@pytest.mark.parametrize("add_special", [False, True])
@pytest.mark.parametrize("style", STYLES)
def test_encode_matches_hf(ext: Any, tokenizer_json: dict, style: str, add_special: bool) -> None:
    assert len(TEXTS) >= 1000
    ours, hf = load(ext, tokenizer_json[style])
    assert_same_ids(ours, hf, TEXTS, add_special)


@pytest.mark.parametrize("style", STYLES)
def test_round_trip(ext: Any, tokenizer_json: dict, style: str) -> None:
    ours, hf = load(ext, tokenizer_json[style])
    for text in TEXTS:
        ids = ours.encode(text, True)
        for skip in (False, True):
            want = hf.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip) == want, text
            assert ours.decode_bytes(ids, skip) == want.encode()
        plain = ours.encode(text, False)
        if hf.decode(plain, skip_special_tokens=False) == text:
            assert ours.decode(plain, False) == text
        if style == "qwen":  # the byte alphabet covers everything: round trip up to HF's NFC
            assert ours.decode(plain, False) == normalizers.NFC().normalize_str(text)


def _random_ids(rng: random.Random, vocab: int) -> list[int]:
    ids = []
    for _ in range(rng.randint(0, 24)):
        r = rng.random()
        if r < 0.5:
            ids.append(rng.randrange(256))  # single-byte tokens: lots of invalid UTF-8
        elif r < 0.9:
            ids.append(rng.randrange(vocab))
        else:
            ids.append(rng.randrange(vocab, vocab + 10))  # unknown ids are skipped
    return ids


@pytest.mark.parametrize("style", STYLES)
def test_decode_random_ids(ext: Any, tokenizer_json: dict, style: str) -> None:
    ours, hf = load(ext, tokenizer_json[style])
    rng = random.Random(7)
    for _ in range(2000):
        ids = _random_ids(rng, ours.vocab_size())
        for skip in (False, True):
            assert ours.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), ids


@pytest.mark.parametrize("style", STYLES)
def test_stream_decode(ext: Any, tokenizer_json: dict, style: str) -> None:
    ours, _ = load(ext, tokenizer_json[style])
    rng = random.Random(11)
    cases = [_random_ids(rng, ours.vocab_size()) for _ in range(1000)]
    cases += [ours.encode(t, True) for t in TEXTS[:300]]
    for ids in cases:
        for skip in (False, True):
            chunks = ours.stream_decode(ids, skip)
            assert len(chunks) == len(ids) + 1
            assert "".join(chunks) == ours.decode(ids, skip), ids
            for chunk in chunks:
                chunk.encode("utf-8")  # valid UTF-8 (no lone surrogates)
    # A 4-byte character split over byte tokens is emitted once complete.
    byte_ids = [ours.token_to_id(_byte_char(b)) for b in "😀".encode()]
    assert ours.stream_decode(byte_ids, False) == ["", "", "", "😀", ""]
    # A dangling prefix is flushed as one U+FFFD, like decode().
    assert ours.stream_decode(byte_ids[:2], False) == ["", "", "\ufffd"]


def _byte_char(b: int) -> str:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


@pytest.mark.parametrize("style", STYLES)
def test_token_queries(ext: Any, tokenizer_json: dict, style: str) -> None:
    data = tokenizer_json[style]
    ours, hf = load(ext, data)
    assert ours.vocab_size() == 2048
    for added in data["added_tokens"]:
        assert ours.token_to_id(added["content"]) == added["id"] == hf.token_to_id(added["content"])
        assert ours.is_special(added["id"]) == added["special"]
        assert ours.token_bytes(added["id"]) == added["content"].encode()
    assert ours.token_to_id("\u0120the") == hf.token_to_id("\u0120the")
    assert ours.token_bytes(ours.token_to_id("\u0120the")) == b" the"
    assert ours.token_to_id("no such token") is None
    assert not ours.is_special(5) and not ours.is_special(10**6)
    with pytest.raises(IndexError):
        ours.token_bytes(10**6)


def test_concurrent_encode(ext: Any, tokenizer_json: dict) -> None:
    ours, _ = load(ext, tokenizer_json["qwen"])
    serial = [ours.encode(t, True) for t in TEXTS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda t: ours.encode(t, True), TEXTS * 2))
    assert parallel == serial * 2


# ---------------------------------------------------------------------------------------------
# Unicode tables: NFC and the regex character classes over every code point


# Planes 0-3 and 14 (4-13 are unassigned; 15-16 are private use), minus surrogates.
ALL_CODE_POINTS = "".join(
    chr(cp) for cp in [*range(0x40000), *range(0xE0000, 0xE1000)] if not 0xD800 <= cp < 0xE000
)
ASSIGNED = "".join(c for c in ALL_CODE_POINTS if unicodedata.category(c) not in ("Cn", "Co"))


def _probe(base: dict[str, Any], normalizer: Any, pre_tokenizer: Any) -> dict[str, Any]:
    """`base` without merges or added tokens: decode(encode(text)) shows what the normalizer
    and pre-tokenizer kept, cheaply even for megabytes of text."""
    data = _variant(base, normalizer=normalizer, pre_tokenizer=pre_tokenizer, added_tokens=[])
    data["model"]["merges"] = []
    return data


def test_nfc_matches_hf_for_every_code_point(ext: Any, tokenizer_json: dict) -> None:
    probe = _probe(tokenizer_json["qwen"], {"type": "NFC"}, _byte_level())
    ours, _ = load(ext, probe)
    hf_nfc = normalizers.NFC()
    for context in ("a{}\u0316\u0301 ", "\u1100{}\u0301\u0316|", "{}\u0345\u0323\n"):
        text = "".join(context.format(c) for c in ASSIGNED)
        got = ours.decode(ours.encode(text, False), False)
        if got != hf_nfc.normalize_str(text):
            bad = [c for c in ASSIGNED if ours.decode(ours.encode(context.format(c), False), False)
                   != hf_nfc.normalize_str(context.format(c))]  # fmt: skip
            pytest.fail(f"NFC differs for {[hex(ord(c)) for c in bad[:20]]} in {context!r}")


@pytest.mark.parametrize(
    "pattern", [r"\s", r"\S", r"\p{L}", r"\p{N}", r"[^\s\p{L}\p{N}]", r"\w", r"\d", r"\p{Lu}"]
)
def test_regex_class_matches_hf_for_every_code_point(
    ext: Any, tokenizer_json: dict, pattern: str
) -> None:
    split = _split({"Regex": pattern}, "Removed", False)
    pre = {"type": "Sequence", "pretokenizers": [split, _byte_level()]}
    probe = _probe(tokenizer_json["llama3"], None, pre)
    ours, _ = load(ext, probe)
    kept = ours.decode(ours.encode(ALL_CODE_POINTS, False), False)
    hf_split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    want = "".join(piece for piece, _ in hf_split.pre_tokenize_str(ALL_CODE_POINTS))
    if kept != want:
        diff = sorted(set(kept) ^ set(want))
        pytest.fail(f"{pattern} differs from Oniguruma for {[hex(ord(c)) for c in diff[:20]]}")


# ---------------------------------------------------------------------------------------------
# Variants: every supported component option, against HF


def _variant(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    data.update(changes)
    return data


def _byte_level(prefix: bool = False, regex: bool = False) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True,
            "use_regex": regex}  # fmt: skip


def _split(pattern: dict[str, str], behavior: str, invert: bool) -> dict[str, Any]:
    return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}


def _variants(tokenizer_json: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    qwen, llama = tokenizer_json["qwen"], tokenizer_json["llama3"]
    out = {
        "gpt2": _variant(llama, pre_tokenizer=_byte_level(prefix=True, regex=True)),
        "gpt2_noprefix": _variant(qwen, pre_tokenizer=_byte_level(regex=True)),
        "no_decoder": _variant(llama, decoder=None),
        "nfc_sequence": _variant(
            qwen, normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}]}
        ),
    }
    for behavior in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for invert in (False, True):
            for name, pattern in (("ws", {"Regex": r"\s+"}), ("digit", {"Regex": r"\p{N}"}),
                                  ("str", {"String": "o"}), ("paren", {"String": "(."}),
                                  ("empty", {"Regex": r"e*"})):  # fmt: skip
                steps = [_split(pattern, behavior, invert), _byte_level()]
                pre = {"type": "Sequence", "pretokenizers": steps}
                out[f"split_{name}_{behavior}_{invert}"] = _variant(llama, pre_tokenizer=pre)
    string_merges = copy.deepcopy(qwen)
    string_merges["model"]["merges"] = [" ".join(m) for m in qwen["model"]["merges"]]
    out["string_merges"] = string_merges
    flags = copy.deepcopy(qwen)
    next_id = max(t["id"] for t in flags["added_tokens"]) + 1
    extra = [
        ("<mask>", dict(lstrip=True, rstrip=True, special=True, normalized=False)),
        ("ony", dict(single_word=True, special=False, normalized=True)),
        ("the", dict(single_word=True, lstrip=True, special=False, normalized=False)),
        ("\u00c5ng", dict(special=False, normalized=True)),
        ("er", dict(special=True, normalized=False, rstrip=True)),  # already in the vocabulary
        ("<wrong id>", dict(special=False, normalized=False)),
    ]
    for i, (content, opts) in enumerate(extra):
        entry = {"id": next_id + i, "content": content, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": True, "special": False}  # fmt: skip
        entry.update(opts)
        flags["added_tokens"].append(entry)
    flags["added_tokens"][-1]["id"] = 5000  # HF ignores stored ids and reassigns
    out["added_flags"] = flags
    return out


VARIANT_TEXTS = [
    *TEXTS[:400],
    "Hi <mask> there\t<mask>\t<mask>\u2000 x<mask>y",
    "anthony ony ony, ony_ x ony\u0301 the other the",
    "A\u030ang \u00c5ng \u212bng",
    "water er  er\n",
    "<wrong id><wrong id>",
]


def test_variants_match_hf(ext: Any, tokenizer_json: dict) -> None:
    failures = []
    for name, data in _variants(tokenizer_json).items():
        ours, hf = load(ext, data)
        for text in VARIANT_TEXTS:
            for add_special in (False, True):
                got = ours.encode(text, add_special)
                want = hf.encode(text, add_special_tokens=add_special).ids
                if got != want:
                    failures.append((name, text, got, want))
                    break
            if got == want and ours.decode(got, False) != hf.decode(got, skip_special_tokens=False):
                failures.append((name, "decode", text))
    assert not failures, f"{len(failures)} failures, first: {failures[:3]}"


def test_vocab_size_counts_highest_id(ext: Any, tokenizer_json: dict) -> None:
    data = copy.deepcopy(tokenizer_json["llama3"])
    data["model"]["vocab"]["zzz_sparse"] = 3000
    ours, hf = load(ext, data)
    assert ours.vocab_size() == 3001
    assert ours.token_to_id("zzz_sparse") == hf.token_to_id("zzz_sparse") == 3000


# ---------------------------------------------------------------------------------------------
# Unsupported components are rejected by name


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("normalizer", {"type": "Lowercase"}, "Lowercase"),
        ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFKC"}]}, "NFKC"),
        ("pre_tokenizer", {"type": "Metaspace", "replacement": "_"}, "Metaspace"),
        ("model", {"type": "WordPiece", "vocab": {}, "unk_token": "[UNK]"}, "WordPiece"),
        ("post_processor", {"type": "BertProcessing", "sep": ["[SEP]", 1]}, "BertProcessing"),
        ("decoder", {"type": "WordPiece", "prefix": "##"}, "WordPiece"),
        ("truncation", {"max_length": 8}, "truncation"),
    ],
)
def test_unsupported_component(
    ext: Any, tokenizer_json: dict, field: str, value: Any, name: str
) -> None:
    data = _variant(tokenizer_json["qwen"], **{field: value})
    with pytest.raises(RuntimeError, match=name):
        ext.Tokenizer(json.dumps(data))


def test_lone_surrogates_rejected(ext: Any, tokenizer_json: dict) -> None:
    ours, _ = load(ext, tokenizer_json["qwen"])
    with pytest.raises(TypeError):
        ours.encode("\ud800", False)  # lone surrogates never reach C++


def test_demo_tokenizer_is_deterministic(tmp_path: Path) -> None:
    from ninfer.demo.tokenizer import save_tokenizer

    path = save_tokenizer("qwen", tmp_path)
    assert json.loads(path.read_text()) == make_tokenizer("qwen")
    assert make_tokenizer("llama3")["model"]["ignore_merges"] is True
