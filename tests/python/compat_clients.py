"""The official `anthropic` client (Messages API) and the `openai` client's Responses API
against `kiln serve`: plain, streamed and tool-calling requests.

Usage: compat_clients.py BASE_URL (text|tools|images [PNG PNG])

`text`: plain and streamed answers, stop sequences, usage, errors in each API's shape.
`tools`: the model's template writes Hermes-style calls; forced calls come back as tool_use
blocks / function_call items whose input follows the schema, streamed and not, and a tool
result sent back gets an answer.
`images`: a PNG sent by each client (OpenAI chat `image_url`, Anthropic `image` block,
Responses `input_image`) gets an answer; greedy answers to one image agree across the three
APIs' token counts, and a second image changes the first answer's log-probabilities.
"""
import json
import sys

import anthropic
import jsonschema
import openai

base, mode = sys.argv[1], sys.argv[2]
ac = anthropic.Anthropic(base_url=base, api_key="sk-kiln", max_retries=0)
oc = openai.OpenAI(base_url=base + "/v1", api_key="sk-kiln", max_retries=0)
model = oc.models.list().data[0].id

if mode == "images":
    import base64
    first, second = (base64.b64encode(open(p, "rb").read()).decode() for p in sys.argv[3:5])
    def chat(b64):
        return oc.chat.completions.create(model=model, max_tokens=4, temperature=0, logprobs=True,
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
                {"type": "text", "text": "Water boils at"}]}])
    a, b = chat(first), chat(second)
    assert a.choices[0].message.content and a.usage.prompt_tokens > 0, a
    lp = lambda c: [t.logprob for t in c.choices[0].logprobs.content]
    assert lp(a) != lp(b), (lp(a), lp(b))
    m = ac.messages.create(model=model, max_tokens=4, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": first}},
            {"type": "text", "text": "Water boils at"}]}])
    assert m.content and m.content[0].type == "text" and m.content[0].text, m
    assert m.usage.input_tokens == a.usage.prompt_tokens, (m.usage, a.usage)
    r = oc.responses.create(model=model, max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64," + first},
            {"type": "input_text", "text": "Water boils at"}]}])
    assert r.status in ("completed", "incomplete") and r.usage.input_tokens == a.usage.prompt_tokens, r
    print("chat:", repr(a.choices[0].message.content), "| messages:", repr(m.content[0].text),
          "| responses:", repr(r.output_text))
elif mode == "text":
    # Messages: whole, then streamed; the same greedy text both ways.
    m = ac.messages.create(model=model, max_tokens=24, extra_body={"temperature": 0},
                           system="You are brief.",
                           messages=[{"role": "user", "content": "Name three colours."}])
    assert m.type == "message" and m.role == "assistant", m
    assert m.content and m.content[0].type == "text" and m.content[0].text, m
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0, m.usage
    with ac.messages.stream(model=model, max_tokens=24, extra_body={"temperature": 0}, system="You are brief.",
                            messages=[{"role": "user", "content": "Name three colours."}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == m.content[0].text, (streamed, m.content[0].text)
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
    # A stop sequence ends the text before it and is named.
    words = m.content[0].text.split()
    if len(words) > 2:
        stop = words[1]
        cut = ac.messages.create(model=model, max_tokens=24, extra_body={"temperature": 0}, system="You are brief.",
                                 stop_sequences=[stop],
                                 messages=[{"role": "user", "content": "Name three colours."}])
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut
        assert stop not in cut.content[0].text, cut
    # Structured output (output_config.format): JSON following the schema.
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["colour", "count"], "additionalProperties": False}
    j = ac.messages.create(model=model, max_tokens=60, messages=[{"role": "user", "content": "A colour?"}],
                           output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(j.content[0].text), schema)
    # Errors in Anthropic's shape.
    try:
        ac.messages.create(model=model, max_tokens=0, messages=[{"role": "user", "content": "x"}])
        raise SystemExit("max_tokens 0 was accepted")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body
    bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
    try:
        bad.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "x"}])
        raise SystemExit("a wrong key was accepted")
    except anthropic.AuthenticationError:
        pass

    # Responses: whole, then streamed (raw events and the accumulating helper).
    r = oc.responses.create(model=model, input="Name three colours.", instructions="You are brief.",
                            max_output_tokens=200, temperature=0)
    assert r.object == "response" and r.status == "completed", r
    text = r.output_text
    assert text and r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r
    kinds, deltas = [], []
    for ev in oc.responses.create(model=model, input="Name three colours.",
                                  instructions="You are brief.", max_output_tokens=200,
                                  temperature=0, stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert "".join(deltas) == text, ("".join(deltas), text)
    with oc.responses.stream(model=model, input="Name three colours.",
                             instructions="You are brief.", max_output_tokens=200,
                             temperature=0) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.output_text == text, (final.output_text, text)
    # Cut by max_output_tokens: incomplete, streamed or not.
    cut = oc.responses.create(model=model, input="Count to fifty.", max_output_tokens=4, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens", cut
    last = [ev.type for ev in oc.responses.create(model=model, input="Count to fifty.",
                                                  max_output_tokens=4, temperature=0, stream=True)][-1]
    assert last == "response.incomplete", last
    # Input items, a multi-turn conversation.
    r2 = oc.responses.create(model=model, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "Say bye."}])
    assert r2.output_text, r2
    try:
        oc.responses.create(model=model, input="x", previous_response_id="resp_1")
        raise SystemExit("previous_response_id was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
    print("messages:", repr(m.content[0].text), "| responses:", repr(text))
else:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                               "unit": {"enum": ["C", "F"]}},
              "required": ["city", "unit"], "additionalProperties": False}
    tool = {"name": "get_weather", "description": "Weather in a city", "input_schema": schema}
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m = ac.messages.create(model=model, max_tokens=200, extra_body={"temperature": 0.7}, tools=[tool],
                               tool_choice=dict(choice, disable_parallel_tool_use=True), messages=ask)
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(uses) == 1, m
        assert uses[0].name == "get_weather", uses
        jsonschema.validate(uses[0].input, schema)
        with ac.messages.stream(model=model, max_tokens=200, extra_body={"temperature": 0.7}, tools=[tool],
                                tool_choice=dict(choice, disable_parallel_tool_use=True),
                                messages=ask) as s:
            final = s.get_final_message()
        suses = [b for b in final.content if b.type == "tool_use"]
        assert final.stop_reason == "tool_use" and len(suses) == 1, final
        jsonschema.validate(suses[0].input, schema)
    # The call and its result go back; the model answers.
    reply = ac.messages.create(model=model, max_tokens=12, extra_body={"temperature": 0}, tools=[tool], messages=ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id,
                                           "name": "get_weather", "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "-3 C"}]}])
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use"), reply

    fn = {"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": schema}
    for stream in (False, True):
        kw = dict(model=model, input="Weather in Oslo?", tools=[fn], tool_choice="required",
                  parallel_tool_calls=False, max_output_tokens=200, temperature=0.7)
        if stream:
            with oc.responses.stream(**kw) as s:
                for _ in s:
                    pass
                r = s.get_final_response()
        else:
            r = oc.responses.create(**kw)
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather", r.output
        jsonschema.validate(json.loads(calls[0].arguments), schema)
    r = oc.responses.create(model=model, max_output_tokens=12, temperature=0, tools=[fn], input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "-3 C"}])
    assert r.status in ("completed", "incomplete"), r
    print("tool_use:", uses[0].input, "| function_call:", calls[0].arguments)
