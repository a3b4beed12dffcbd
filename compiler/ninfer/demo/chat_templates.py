"""Chat templates for demo checkpoints (written for ninfer; structured like the upstream ones).

- `QWEN3_TEMPLATE` follows the structure of the Qwen3 template: optional tools section,
  `<think>` reasoning split out of assistant contents, reasoning kept only for assistant turns
  after the last user query (with an empty think block for such a trailing turn), tool
  responses folded into user turns, and `enable_thinking=false` adding an empty think block to
  the generation prompt. The demo uses it (`DEMO_TEMPLATE`); like every chat template it is
  compiled to C++ (ninfer.frontend.chat_codegen).
- `QWEN3_SIMPLE_TEMPLATE`: the same ChatML framing and generation prompt (including
  `enable_thinking=false`), with every message rendered verbatim. It agrees with
  `QWEN3_TEMPLATE` on the common serving case: no tools, the conversation ends with a user
  message, and no assistant content contains `</think>`.
- `QWEN2_TEMPLATE`: Qwen2.5 style, injecting a default system prompt when none is given.
- `LLAMA3_TEMPLATE`: Llama-3 instruct style, bos_token prefix and trimmed contents.
"""

QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

_TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)

# Renders assistant tool calls; expects `content` to be set. Shared by both Qwen templates.
_TOOL_CALLS = r"""
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}"""

# Renders a run of tool messages as one user turn of <tool_response> blocks.
_TOOL_RESPONSE = r"""
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}"""

QWEN3_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '"""
    + _TOOLS_PREAMBLE
    + r"""' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '"""
    + _TOOLS_POSTAMBLE
    + r"""<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string
          and not (message.content.startswith('<tool_response>')
                   and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n')
                                               .split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n')
                + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}"""
    + _TOOL_CALLS
    + r"""
        {{- '<|im_end|>\n' }}"""
    + _TOOL_RESPONSE
    + r"""
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""
)

QWEN3_SIMPLE_TEMPLATE = r"""{%- for message in messages %}
    {%- if message.role in ['system', 'user', 'assistant'] %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- else %}
        {{- raise_exception('Unsupported role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

QWEN2_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '"""
    + QWEN_DEFAULT_SYSTEM
    + r"""' }}
    {%- endif %}
    {{- '\n\n"""
    + _TOOLS_PREAMBLE
    + r"""' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '"""
    + _TOOLS_POSTAMBLE
    + r"""<|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\n"""
    + QWEN_DEFAULT_SYSTEM
    + r"""<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
          or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content or '' %}
        {{- '<|im_start|>' + message.role }}
        {%- if content %}
            {{- '\n' + content }}
        {%- endif %}"""
    + _TOOL_CALLS.replace("(loop.first and content) or (not loop.first)", "true")
    + r"""
        {{- '<|im_end|>\n' }}"""
    + _TOOL_RESPONSE
    + r"""
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
LLAMA3_BOS = "<|begin_of_text|>"
LLAMA3_EOS = "<|eot_id|>"
QWEN_EOS = "<|im_end|>"

# The template the demo compiles.
DEMO_TEMPLATE = QWEN3_TEMPLATE
# The template the demo is trained on: every turn verbatim, so each turn's prompt is a
# prefix of the whole conversation (QWEN3_TEMPLATE renders a trailing assistant turn with
# an empty think block, which a prefix does not have). The two render the same prompts for
# the demo's conversations (no tools, no reasoning, ending with a user message).
DEMO_TRAIN_TEMPLATE = QWEN3_SIMPLE_TEMPLATE
