"""Drives `kvb serve` with the real `openai` Python package, as an application would.

usage: openai_client.py BASE_URL MODEL

Every check is an assert; the script exits non-zero at the first one that fails and prints a
one-line summary when all pass.
"""

import json
import sys
import urllib.request

import openai
from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

# /v1/models lists the served model.
models = [m.id for m in client.models.list().data]
assert models == [model], models

messages = [
    {"role": "system", "content": "You are a helpful assistant who answers in one sentence."},
    {"role": "user", "content": "Name three colours of the rainbow."},
]

# Chat, whole answer.
first = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0
)
assert first.object == "chat.completion", first.object
assert first.id and first.created > 0
choice = first.choices[0]
assert choice.message.role == "assistant"
assert isinstance(choice.message.content, str)
assert choice.finish_reason in ("stop", "length"), choice.finish_reason
assert first.usage.prompt_tokens > 0
assert 0 < first.usage.completion_tokens <= 12, first.usage
assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens

# The same prompt again: greedy gives the same answer, and most of the prompt is cached.
again = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0
)
assert again.choices[0].message.content == choice.message.content
cached = again.usage.prompt_tokens_details.cached_tokens
assert cached > 0 and cached <= again.usage.prompt_tokens, again.usage

# Chat, streamed with usage: the deltas add up to the same answer.
stream = client.chat.completions.create(
    model=model,
    messages=messages,
    max_tokens=12,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage, chunks = "", None, None, 0
for chunk in stream:
    assert chunk.object == "chat.completion.chunk", chunk.object
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        chunks += 1
        text += c.delta.content or ""
        finish = c.finish_reason or finish
assert text == choice.message.content, (text, choice.message.content)
assert finish == choice.finish_reason, finish
assert usage is not None and usage.completion_tokens == first.usage.completion_tokens, usage
assert usage.prompt_tokens_details.cached_tokens > 0, usage
# One chunk per token at least (the role chunk and the finish chunk come on top).
assert chunks >= usage.completion_tokens, (chunks, usage.completion_tokens)

# Completions, whole and streamed, agree.
prompt = "The three primary colours are"
whole = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
assert whole.object == "text_completion", whole.object
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True
    )
    if c.choices
)
assert streamed == whole.choices[0].text, (streamed, whole.choices[0].text)

# Log-probabilities, as the SDK parses them: one per token, the greedy pick the most likely.
scored = client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
)
content = scored.choices[0].logprobs.content
assert len(content) == scored.usage.completion_tokens, (len(content), scored.usage)
for t in content:
    assert t.logprob <= 0 and len(t.top_logprobs) == 3, t
    assert t.token == t.top_logprobs[0].token and t.logprob == t.top_logprobs[0].logprob, t
    assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)

# Several answers: one choice each, in order; greedy copies are equal.
pair = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0, n=2)
assert [c.index for c in pair.choices] == [0, 1], pair
assert pair.choices[0].message.content == pair.choices[1].message.content, pair
# Streamed, the SDK's chunks carry each copy's index; the copies' texts are the whole answer's.
parts = ["", ""]
for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0, n=2, stream=True):
    for c in chunk.choices:
        parts[c.index] += c.delta.content or ""
assert parts == [c.message.content for c in pair.choices], (parts, pair)

# Errors arrive as the SDK's typed exceptions.
try:
    client.chat.completions.create(model=model, messages=messages, n=17)
    raise AssertionError("n=17 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404

# The SDK's sampling fields are served: a logit bias of 100 forces one token over and over, and
# `user` is accepted. Structured output through the SDK's own `parse`: a Pydantic model in,
# an instance of it out.
def kvb_post(route, body):
    request = urllib.request.Request(
        base_url + route,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.load(urllib.request.urlopen(request))


forced_id = kvb_post("/tokenize", {"model": model, "prompt": " blue"})["tokens"][-1]
forced_text = kvb_post("/detokenize", {"tokens": [forced_id]})["prompt"]
biased = client.completions.create(
    model=model, prompt=prompt, max_tokens=4, temperature=0, logit_bias={str(forced_id): 100},
    frequency_penalty=0, presence_penalty=0, user="app-user-1",
)
assert biased.choices[0].text == forced_text * 4, (biased.choices[0].text, forced_text)
from typing import Literal

from pydantic import BaseModel, Field


class Colour(BaseModel):
    name: Literal["red", "orange", "yellow", "green", "blue", "indigo", "violet"]
    shade: str = Field(max_length=10)
    rank: int = Field(ge=1, le=7)


parsed = client.chat.completions.parse(
    model=model, messages=messages, max_tokens=80, temperature=0.7, seed=3,
    response_format=Colour,
)
colour = parsed.choices[0].message.parsed
assert isinstance(colour, Colour), parsed
assert parsed.choices[0].finish_reason == "stop"

print(f"openai client: ok ({cached} of {again.usage.prompt_tokens} prompt tokens cached on the repeat)")
