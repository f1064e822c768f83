"""Structured output through the official `openai` client against `kiln serve`.

Usage: structured_output.py BASE_URL COUNT [tools]

COUNT random JSON schemas (nested objects, arrays, enums, required fields; every string,
array and integer bounded so a weak model can finish within the token budget) are sent with
`response_format: json_schema, strict: true`; each answer is parsed and checked with the
`jsonschema` package. A `grammar` (Lark, regex-like) answer is checked with `re.fullmatch`,
and a grammar that does not compile must get a 400 naming `grammar`. With `tools`, the model's
template writes Hermes-style calls: `tool_choice: required` and a named function must come
back as tool calls whose arguments follow the function's parameters.
"""
import json
import random
import re
import sys

import jsonschema
import openai

base, count = sys.argv[1], int(sys.argv[2])
with_tools = len(sys.argv) > 3 and sys.argv[3] == "tools"
c = openai.OpenAI(base_url=base, api_key="sk-kiln")
model = c.models.list().data[0].id
rng = random.Random(20261125)
WORDS = ["alpha", "beta", "gamma", "delta", "red", "green", "blue", "north", "south", "cat"]


def leaf():
    kind = rng.choice(["enum", "string", "integer", "boolean"])
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(WORDS, rng.randint(2, 4))}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 12)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)}
    return {"type": "boolean"}


def schema(depth):
    r = rng.random()
    if depth > 0 and r < 0.35:
        names = rng.sample(WORDS, rng.randint(1, 3))
        props = {n: schema(depth - 1) for n in names}
        req = [n for n in names if rng.random() < 0.7]
        return {"type": "object", "properties": props, "required": req,
                "additionalProperties": False}
    if depth > 0 and r < 0.6:
        lo = rng.randint(0, 1)
        return {"type": "array", "items": schema(depth - 1), "minItems": lo,
                "maxItems": lo + rng.randint(0, 2)}
    return leaf()


def top():
    names = rng.sample(WORDS, rng.randint(1, 3))
    props = {n: schema(2) for n in names}
    return {"type": "object", "properties": props,
            "required": rng.sample(names, rng.randint(1, len(names))),
            "additionalProperties": False}


# A model without a chat template (Gemma 3 270M's GGUF has none) answers on /v1/completions,
# with the same response_format in the body.
try:
    c.chat.completions.create(model=model, max_tokens=1,
                              messages=[{"role": "user", "content": "Hi"}])
    chat = True
except openai.BadRequestError as e:
    assert "chat template" in str(e), e
    chat = False


def ask(fmt, seed, temperature=0.8):
    if chat:
        r = c.chat.completions.create(
            model=model, max_tokens=600, temperature=temperature, seed=seed,
            messages=[{"role": "user", "content": "Fill in this JSON object."}],
            response_format=fmt)
        return r.choices[0].message.content, r.choices[0].finish_reason
    r = c.completions.create(model=model, prompt="A JSON object:\n", max_tokens=600,
                             temperature=temperature, seed=seed,
                             extra_body={"response_format": fmt})
    return r.choices[0].text, r.choices[0].finish_reason


ok = 0
for i in range(count):
    s = top()
    text, finish = ask({"type": "json_schema",
                        "json_schema": {"name": f"s{i}", "schema": s, "strict": True}}, i)
    assert finish == "stop", (i, s, text, finish)
    value = json.loads(text)
    jsonschema.validate(value, s)
    ok += 1
print(f"{ok} of {count} random schemas answered with valid JSON")

# Any JSON object, streamed (chat): the pieces join into one object (or, cut by max_tokens,
# the start of one).
if chat:
    parts, finish = [], None
    for ch in c.chat.completions.create(
            model=model, max_tokens=200, temperature=0, stream=True,
            messages=[{"role": "user", "content": "A JSON object, please."}],
            response_format={"type": "json_object"}):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    streamed = "".join(parts)
    if finish == "stop":
        assert isinstance(json.loads(streamed), dict), streamed
    else:
        assert finish == "length" and streamed.startswith("{"), (finish, streamed)

# A regex-like language in Lark: the answer matches it whole.
lark = 'start: /(yes|no), (because|since) [a-z]{1,8}( [a-z]{1,8}){0,3}\\./\n'
pattern = r"(yes|no), (because|since) [a-z]{1,8}( [a-z]{1,8}){0,3}\."
for seed in range(4):
    r = c.completions.create(model=model, prompt="Is the sky blue?", max_tokens=80,
                             temperature=1.0, seed=seed, extra_body={"grammar": lark})
    text = r.choices[0].text
    assert re.fullmatch(pattern, text), (seed, text)
    assert r.choices[0].finish_reason == "stop", r
print("grammar answers:", repr(text))

try:
    c.completions.create(model=model, prompt="x", max_tokens=4,
                         extra_body={"grammar": "start: undefined_rule"})
    raise SystemExit("a grammar that does not compile was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "grammar" in str(e), e

if with_tools:
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                         "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}}
    tools = [weather, clock]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for choice in ["required", {"type": "function", "function": {"name": "get_time"}}]:
        for stream in (False, True):
            kw = dict(model=model, tools=tools, tool_choice=choice, max_tokens=300,
                      temperature=0.7, seed=3, parallel_tool_calls=False,
                      messages=[{"role": "user", "content": "Weather in Oslo?"}])
            if stream:
                calls = {}
                for ch in c.chat.completions.create(stream=True, **kw):
                    for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                        got = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                        got["name"] += tc.function.name or ""
                        got["arguments"] += tc.function.arguments or ""
                calls = list(calls.values())
            else:
                r = c.chat.completions.create(**kw)
                assert r.choices[0].finish_reason == "tool_calls", r
                calls = [{"name": t.function.name, "arguments": t.function.arguments}
                         for t in r.choices[0].message.tool_calls]
            assert len(calls) == 1, (choice, calls)
            name = calls[0]["name"]
            if isinstance(choice, dict):
                assert name == "get_time", calls
            jsonschema.validate(json.loads(calls[0]["arguments"]), params[name])
    print("forced tool call:", calls)
