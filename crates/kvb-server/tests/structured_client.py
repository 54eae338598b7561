"""Structured outputs through the real `openai` Python package: 100 random JSON Schemas, each
answer parsed and validated with the `jsonschema` package (a validator kvb does not share code
with), streamed and whole answers compared, and `json_object` answers parsed.

usage: structured_client.py BASE_URL MODEL

Every check is an assert; the script exits non-zero at the first one that fails and prints a
one-line summary when all pass.
"""

import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def leaf(r):
    """A bounded schema of one value, so that any answer ends within the token limit."""
    kind = r.randrange(8)
    if kind == 0:
        lo = r.randrange(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + r.randrange(0, 10)}
    if kind == 1:
        return {"enum": r.sample(["red", "green", "blue", "a b", "x", "yes", "no"], r.randrange(1, 4))}
    if kind == 2:
        lo = r.randrange(-1000, 1000)
        return {"type": "integer", "minimum": lo, "maximum": lo + r.randrange(0, 500)}
    if kind == 3:
        return {"type": "boolean"}
    if kind == 4:
        return {"type": "null"}
    if kind == 5:
        return {"type": "string", "pattern": "^[a-z]{1,%d}$" % r.randrange(1, 6)}
    if kind == 6:
        return {"const": r.choice(["fixed", 7, True])}
    return {"anyOf": [leaf(r), leaf(r)]}


def schema(r, depth):
    if depth == 0 or r.random() < 0.35:
        return leaf(r)
    if r.random() < 0.3:
        lo = r.randrange(0, 2)
        return {"type": "array", "items": schema(r, depth - 1), "minItems": lo,
                "maxItems": lo + r.randrange(0, 3)}
    names = r.sample(["id", "name", "city", "tags", "score", "ok", "kind", "note"], r.randrange(1, 5))
    return {
        "type": "object",
        "properties": {n: schema(r, depth - 1) for n in names},
        "required": [n for n in names if r.random() < 0.7],
        "additionalProperties": False,
    }


def ask(i, stream=False):
    r = random.Random(i)
    s = schema(r, 2) if i % 5 else {"type": "object", "properties": {"v": schema(r, 2)},
                                    "required": ["v"], "additionalProperties": False}
    args = dict(
        model=model,
        messages=[{"role": "user", "content": f"Give record {i} as JSON."}],
        max_tokens=1000,
        temperature=0.8,
        seed=i,
        response_format={"type": "json_schema",
                         "json_schema": {"name": f"record_{i}", "schema": s, "strict": True}},
    )
    if not stream:
        c = client.chat.completions.create(**args)
        return s, c.choices[0].message.content, c.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **args):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return s, text, finish


with ThreadPoolExecutor(max_workers=8) as pool:
    answers = list(pool.map(ask, range(100)))
for i, (s, text, finish) in enumerate(answers):
    assert finish == "stop", (i, finish, text, s)
    value = json.loads(text)
    jsonschema.validate(value, s)

# Streamed answers are the whole answers, piece by piece.
with ThreadPoolExecutor(max_workers=8) as pool:
    streamed = list(pool.map(lambda i: ask(i, stream=True), range(0, 100, 10)))
for i, (s, text, finish) in zip(range(0, 100, 10), streamed):
    assert (text, finish) == answers[i][1:], (i, text, answers[i][1])

# Any JSON object: a finished answer parses as one.
finished = 0
for seed in range(6):
    c = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "JSON please."}], max_tokens=80,
        temperature=0.7, seed=seed, response_format={"type": "json_object"},
    )
    text = c.choices[0].message.content
    assert text.startswith("{"), text
    if c.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
        finished += 1
assert finished > 0, "no json_object answer finished in 80 tokens"

kinds = sum(len(json.dumps(s)) for s, _, _ in answers) // len(answers)
print(f"structured client: ok (100 schemas of ~{kinds} characters, {finished}/6 objects finished)")
