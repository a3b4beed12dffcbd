"""The chat templates the native test targets carry (tests/native_build.py generates them).

- ninfer_chat_ext: the demo templates, the unit-test templates of test_chat_template.py, and
  every corpus template of tests/real_world.py that compiles (once the corpus is cached);
  registered as "demo/<name>", "unit/<name>", "corpus/<name>".
- fake_server: the fake server's own template (contents concatenated, for the letters
  tokenizer) and, once the corpus is cached, the real Qwen3 template (tests/test_chat_parity.py
  serves it with the real Qwen tokenizer).
"""

from __future__ import annotations

from functools import cache

import real_world
from ninfer.demo import chat_templates as T
from ninfer.frontend.chat_template import ChatTemplate, ChatTemplateError

FAKE_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"

# The fake server's other templates (compiled into it; an artifact picks one by hash).
# test_anthropic.py: every role marked by one letter-token, the generation prompt "a".
ROLE_LETTERS_TEMPLATE = (
    "{% for m in messages %}"
    "{{ {'system': 's', 'user': 'u', 'assistant': 'a', 'tool': 't'}[m.role] }}"
    "{{ m.content if m.content is string else '' }}{% endfor %}"
    "{% if add_generation_prompt %}a{% endif %}")


def scripted_template(generation_prompt: str) -> str:
    """test_output_parsers.py: each message's text and a newline, then `generation_prompt`,
    or Qwen3's closed think block when enable_thinking is false."""
    return ("{% for m in messages %}{{ m.content if m.content is string else '' }}{{ '\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}"
            "{% if enable_thinking is defined and not enable_thinking %}"
            "{{ '<gen><think>\\n\\n</think>\\n\\n' }}{% else %}{{ " + repr(generation_prompt)
            + " }}{% endif %}{% endif %}")


SCRIPTED_PROMPTS = ("<gen>", "<gen><think>\n")

# The acceptance corpus (tests/test_chat_parity.py): name -> the vocab-only GGUF of its
# tokenizer family (qwen2: Qwen2/2.5/3; qwen35: Qwen3.5; llama-bpe: Llama 3, also what
# SmolLM3 uses; Mistral's Tekken has no GGUF in the corpus, llama-bpe stands in).
PARITY = {
    "Qwen-Qwen3-0.6B": "qwen2", "Qwen3.5-4B": "qwen35", "Qwen-Qwen2.5-7B-Instruct": "qwen2",
    "Qwen-QwQ-32B": "qwen2", "Qwen3-Coder": "qwen2",
    "meta-llama-Llama-3.1-8B-Instruct": "llama-bpe",
    "meta-llama-Llama-3.2-3B-Instruct": "llama-bpe",
    "meta-llama-Llama-3.3-70B-Instruct": "llama-bpe",
    "mistralai-Mistral-Nemo-Instruct-2407": "llama-bpe",
    "mistralai-Ministral-3-14B-Reasoning-2512": "llama-bpe",
    "Mistral-Small-3.2-24B-Instruct-2506": "llama-bpe",
    "unsloth-mistral-Devstral-Small-2507": "llama-bpe",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "llama-bpe",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "qwen2",
    "HuggingFaceTB-SmolLM3-3B": "llama-bpe",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "llama-bpe",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "llama-bpe",
}

DEMO = {"qwen3": T.QWEN3_TEMPLATE, "qwen2": T.QWEN2_TEMPLATE, "llama3": T.LLAMA3_TEMPLATE}

# Templates that exercise the value type and the generator beyond what chat templates use.
UNIT = {
    "scoping": (
        "{% set x = 'top' %}{% for i in range(3) %}{% if i == 1 %}{% set x = i %}{% endif %}"
        "[{{ x }}]{% set y = i %}{% endfor %}{{ x }}{{ y }}"
        "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% else %}none{% endfor %}"
        "{% for m in [] %}x{% else %}empty{% endfor %}"
        "{% for v in [1, 2, 3, 4, 5] if v is odd %}{{ loop.index }}/{{ loop.length }}"
        "{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.previtem }}{{ loop.nextitem }}"
        "{{ loop.cycle('a', 'b') }};{% endfor %}"
        "{% for v in range(10) %}{% if v == 2 %}{% continue %}{% endif %}{% if v > 4 %}"
        "{% break %}{% endif %}{{ v }}{% endfor %}"
        "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}"
        "{% set a, b = 1, 'two' %}{{ a }}{{ b }}"
        "{% set block %}  inner {{ a }} {% endset %}[{{ block }}]"
        "{% set tb | trim | upper %}  up {{ b }} {% endset %}[{{ tb }}]"
        "{% filter upper %}filtered {{ b }}{% endfilter %}"
        "{% macro m(p, q=2, r=none) %}<{{ p }}{{ q }}{{ r }}{{ a }}>{% endmacro %}"
        "{{ m(1) }}{{ m(1, 3) }}{{ m('x', r='z') }}"
        "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}"
        "{% endmacro %}{{ fact(4) }}"
    ),
    "values": (
        "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 1 / 4 }} {{ 4 / 2 }} {{ 2 ** 10 }}"
        " {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 3.0 }} {{ 1.5e300 * 1e10 }} {{ -0.0 }}"
        " {{ 1 + true }}"
        " {{ [1, 'a', none, true, 1.0, {'k': [1]}, (1,), ('it\\'s', 'a\"b')] }}"
        " {{ 'abc'[::-1] }} {{ [1, 2, 3][-2:] }} {{ 'héllo'[1:3] }} {{ 'héllo'[-1] }}"
        " {{ 'héllo' | length }} {{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2, 3, 4, 5][4:0:-2] }}"
        " {{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a b c'.split(' ', 1) }}"
        " {{ 'a b c'.rsplit(' ', 1) }} {{ '  x\\n'.strip() }}|{{ 'xxhixx'.strip('x') }}"
        "|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'hi  '.rstrip() }}"
        " {{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('lo', 'x')) }}"
        " {{ 'aaa'.replace('a', 'b', 2) }} {{ 'MiXed wOrds'.upper() }} {{ 'MiXed wOrds'.lower() }}"
        " {{ 'hello world'.title() }} {{ 'hello World'.capitalize() }} {{ 'héllo'.find('l') }}"
        " {{ '-'.join(['a', 'b']) }} {{ 'abcabc'.count('b') }}"
        " {{ {'a': 1, 'b': 2}.items() | list }} {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z', 9) }}"
        " {{ {'a': 1}.get('z') }} {{ {'b': 1, 'a': 2}.keys() | list }}"
        " {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'b' in 'abc' }} {{ 2 in [1, 2] }}"
        " {{ 'a' in {'a': 1} }} {{ 'z' not in 'abc' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"
        " {{ none }} {{ true }} {{ undefined_name }}|{{ (none or 'x') }} {{ ('' and 'y') }}"
        " {{ 'y' if false }}|{{ 'a' ~ 1 ~ none ~ [1] }} {{ -3 | abs }}"
        " {{ strftime_now is defined }} {{ range is defined }} {{ namespace is callable }}"
    ),
    "filters": (
        "{{ x | tojson }} {{ x | tojson(indent=2) }} {{ x | tojson(sort_keys=true) }}"
        " {{ 'é\"\\\\\\n\\u2028🙂' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }}"
        " {{ x | tojson(separators=(',', ':')) }} {{ [] | tojson(indent=4) }}"
        " {{ '  t  ' | trim }}|{{ 'xxtxx' | trim('x') }} {{ [3, 1, 2] | sort }}"
        " {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}"
        " {{ [3, 1, 2] | sort(reverse=true) }}"
        " {{ users | sort(attribute='age') | map(attribute='name') | list }}"
        " {{ users | selectattr('age', 'gt', 20) | map(attribute='name') | join(',') }}"
        " {{ users | rejectattr('admin') | list | length }}"
        " {{ users | selectattr('admin') | list | length }}"
        " {{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }}"
        " {{ [1, none, 2] | reject('none') | list }} {{ ['a', 'A', 'b'] | unique | list }}"
        " {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ [] | first }} {{ 'abc' | list }}"
        " {{ {'b': 1, 'a': 2} | dictsort }} {{ {'b': 1, 'a': 2} | items | list }}"
        " {{ undefined_name | default('dflt') }} {{ '' | default('e', true) }} {{ none | d('n') }}"
        " {{ 'MiX' | lower }} {{ 'MiX' | upper }} {{ 'one two-three(four' | title }}"
        " {{ 'hi there' | capitalize }}"
        " {{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}"
        " {{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int(5) }} {{ 3.9 | int }} {{ '2.5' | float }}"
        " {{ 'aXbXc' | replace('X', '-') }} {{ [1, 2] | string }} {{ 5 | string }}"
        " {{ 'hi' | safe }}"
        " {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ 2.5 | round }}"
        " {{ 2.567 | round(2) }}"
        " {{ 'one two  three' | wordcount }} {{ [1, 2, 3] | sum }} {{ [3, 1, 2] | max }}"
        " {{ [3, 1, 2] | min }} {{ 'x' | center(5) }}|{{ '<a href=\"x\">' | e }}"
        " {{ [1, 2] | count }}"
        " {{ x is mapping }} {{ x is iterable }} {{ x.a is sequence }} {{ 'x' is string }}"
        " {{ 1 is number }} {{ true is number }} {{ true is boolean }} {{ 1 is integer }}"
        " {{ 1.0 is float }} {{ none is none }} {{ false is false }} {{ true is true }}"
        " {{ undefined_name is defined }} {{ undefined_name is undefined }}"
        " {{ 4 is divisibleby 2 }}"
        " {{ 1 is eq 1 }} {{ 2 is in [1, 2] }} {{ x is callable }} {{ x.get is callable }}"
        " {{ undefined_name is iterable }} {{ undefined_name is sequence }}"
    ),
    "raises": (
        "{% if messages | length > 1 %}{{ raise_exception('Only one message, got ' ~ "
        "messages | length) }}{% endif %}{{ messages[0].content }}"
        "{% if messages[0].content == 'attr' %}{{ messages[0].missing.deeper }}{% endif %}"
        "{% if messages[0].content == 'add' %}{{ 'a' + 1 }}{% endif %}"
        "{% if messages[0].content == 'none' %}{{ none + 'a' }}{% endif %}"
        "{% if messages[0].content == 'index' %}{{ messages[5].content }}{% endif %}"
        "{% if messages[0].content == 'iter' %}{% for x in 5 %}{% endfor %}{% endif %}"
        "{% if messages[0].content == 'json' %}{{ undefined_name | tojson }}{% endif %}"
        "{% if messages[0].content == 'cmp' %}{{ 'a' < 1 }}{% endif %}"
        "{% if messages[0].content == 'ns' %}{% set x = 1 %}{% set x.y = 2 %}{% endif %}"
        "{% if messages[0].content == 'append' %}{{ messages.append(1) }}{% endif %}"
        "{% if messages[0].content == 'undef' %}{{ nothing.at_all }}{% endif %}"
    ),
}


@cache
def corpus_compiles() -> dict[str, str]:
    """Corpus name -> the error of each corpus template ninfer's compiler refuses ('' if it
    compiles)."""
    from ninfer.frontend.chat_codegen import generate

    out = {}
    for name, source in real_world.corpus_templates().items():
        try:
            generate(ChatTemplate("default", source), "probe", "probe")
            out[name] = ""
        except ChatTemplateError as e:
            out[name] = str(e)
    return out


def native_template_sets() -> dict[str, tuple[str, list[tuple[str, ChatTemplate]]]]:
    """target -> (directory under build/native, [(registered name, template)])."""
    ext = [(f"demo/{n}", ChatTemplate("default", s)) for n, s in DEMO.items()]
    ext += [(f"unit/{n}", ChatTemplate("default", s)) for n, s in UNIT.items()]
    fake = [("fake", ChatTemplate("default", FAKE_TEMPLATE)),
            ("role_letters", ChatTemplate("default", ROLE_LETTERS_TEMPLATE))]
    fake += [(f"scripted{i}", ChatTemplate("default", scripted_template(g)))
             for i, g in enumerate(SCRIPTED_PROMPTS)]
    if real_world.cached():
        corpus = real_world.corpus_templates()
        ext += [(f"corpus/{n}", ChatTemplate("default", corpus[n]))
                for n in PARITY if not corpus_compiles()[n]]
        fake.append(("qwen3", ChatTemplate("default", corpus["Qwen-Qwen3-0.6B"])))
    return {"ninfer_chat_ext": ("chat_templates", ext),
            "fake_server": ("fake_chat_templates", fake)}
