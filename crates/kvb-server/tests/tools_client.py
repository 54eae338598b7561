"""Tool calling through the real `openai` Python package, on the default model: a forced
call's arguments fit the function's schema, streamed or not, and the call and its result go
back in the history.

usage: tools_client.py BASE_URL MODEL
"""

import json
import sys

from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

# Tool calling: a forced call's arguments fit the function's schema, streamed or not.
weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
asked = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.chat.completions.create(
    model=model, messages=asked, tools=[weather], tool_choice="required", max_tokens=80,
    temperature=0.5, seed=2, parallel_tool_calls=False,
)
assert called.choices[0].finish_reason == "tool_calls", called
call = called.choices[0].message.tool_calls[0]
args = json.loads(call.function.arguments)
assert call.function.name == "get_weather" and set(args) == {"city", "unit"}, call
assert args["unit"] in ("celsius", "fahrenheit") and len(args["city"]) <= 12, args
pieces = {}
for chunk in client.chat.completions.create(
    model=model, messages=asked, tools=[weather], tool_choice="required", max_tokens=80,
    temperature=0.5, seed=2, parallel_tool_calls=False, stream=True,
):
    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        p = pieces.setdefault(d.index, {"name": "", "arguments": ""})
        p["name"] += d.function.name or ""
        p["arguments"] += d.function.arguments or ""
assert pieces[0] == {"name": "get_weather", "arguments": call.function.arguments}, pieces
# The call and its result go back in the history.
answered = client.chat.completions.create(
    model=model, max_tokens=8, temperature=0, tools=[weather],
    messages=asked + [called.choices[0].message,
                      {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"}],
)
assert answered.usage.prompt_tokens > called.usage.prompt_tokens

print("tools client: ok", call.function.arguments)
