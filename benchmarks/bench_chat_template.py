"""Chat template render time: the C++ ninfer generates against jinja2, in the same run.

    PYTHONPATH=compiler:tests .venv/bin/python benchmarks/bench_chat_template.py

Renders a 20-message conversation with tools (system prompt, user turns, assistant turns
with reasoning and tool calls, tool results) through the official Qwen3 template of
llama.cpp's corpus (tests/real_world.py fetches it): through the generated C++ (the
ninfer_chat_ext test module: the render alone, and the JSON context's parse and conversion
the server adds) and through jinja2 in transformers' environment, compiled once (as
transformers caches it). Checks both give the same text; prints microseconds per render
and the ratio.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def conversation() -> dict[str, Any]:
    from ninfer.chat_verify import _TOOLS

    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(4):
        msgs.append({"role": "user", "content": f"Question {turn}: what is the weather in "
                                                "Paris, and what is 2 + 3?"})
        msgs.append({"role": "assistant", "content": "",
                     "reasoning_content": "The user wants the weather and a sum.",
                     "tool_calls": [
                         {"id": f"c{turn}a", "type": "function",
                          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                         {"id": f"c{turn}b", "type": "function",
                          "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{turn}a", "content": '{"temp": 21}'})
        msgs.append({"role": "tool", "tool_call_id": f"c{turn}b", "content": "5"})
    msgs.append({"role": "assistant", "content": "It is 21 degrees in Paris; 2 + 3 = 5."})
    msgs.append({"role": "user", "content": "Thanks! And tomorrow?"})
    msgs.append({"role": "assistant", "content": "<think>Need a forecast.</think>Let me check."})
    assert len(msgs) == 20
    return {"messages": msgs, "tools": list(_TOOLS), "add_generation_prompt": True,
            "enable_thinking": True, "eos_token": "<|im_end|>"}


def best(fn: Any, repeats: int, number: int) -> float:  # seconds per call
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(number)
        times.append((time.perf_counter() - t0) / number)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--number", type=int, default=200, help="renders per timing")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import native_build
    import real_world
    from ninfer.frontend.chat_template import Renderer

    source = real_world.corpus_templates()["Qwen-Qwen3-0.6B"]
    ext = native_build.extension("ninfer_chat_ext")
    ctx = conversation()
    ctx_json = json.dumps(ctx)
    jinja = Renderer(source)
    [(ok, text, _)] = ext.render_chat_template("corpus/Qwen-Qwen3-0.6B", [ctx_json])
    assert ok and text == jinja(ctx), "the two renderings differ"

    def run_jinja(n: int) -> None:
        for _ in range(n):
            jinja(ctx)

    timings = [ext.time_chat_template("corpus/Qwen-Qwen3-0.6B", ctx_json, args.number)
               for _ in range(args.repeats)]
    parse_s = min(t[0] for t in timings)
    render_s = min(t[1] for t in timings)
    jinja_s = best(run_jinja, args.repeats, max(1, args.number // 10))
    print(f"Qwen3 template, 20 messages with 4 tools, {len(text)} characters; best of "
          f"{args.repeats}")
    print(f"{'':28}{'us':>10}")
    print(f"{'ninfer: parse JSON context':28}{parse_s * 1e6:10.1f}")
    print(f"{'ninfer: render':28}{render_s * 1e6:10.1f}")
    print(f"{'jinja2: render':28}{jinja_s * 1e6:10.1f}")
    print(f"render ratio (jinja2 / ninfer): {jinja_s / render_s:.1f}x; with the JSON parse: "
          f"{jinja_s / (parse_s + render_s):.1f}x")


if __name__ == "__main__":
    main()
