"""The official OpenAI Python SDK (`openai` on PyPI) as an agent's client of a turn's LLM
gateway's Responses API, over the unix socket (httpx's `uds` transport), with the run's spawn
token as its API key. Input on stdin: {"socket": PATH, "token": TOKEN, "model": MODEL}.
Output: one JSON object of what the SDK saw.
"""
import json
import sys

import httpx2
import openai

i = json.load(sys.stdin)


def client(key):
    return openai.OpenAI(
        api_key=key,
        base_url="http://gateway/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.HTTPTransport(uds=i["socket"])),
    )


out = {}
c = client(i["token"])
r = c.responses.create(model=i["model"], input="from the sdk", max_output_tokens=50)
out["plain"] = {
    "text": r.output_text,
    "status": r.status,
    "input_tokens": r.usage.input_tokens,
    "output_tokens": r.usage.output_tokens,
}
deltas = []
final = None
with c.responses.create(model=i["model"], input="streamed", stream=True) as s:
    for ev in s:
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type == "response.completed":
            final = ev.response
out["stream"] = {
    "deltas": deltas,
    "text": final.output_text if final else None,
    "output_tokens": final.usage.output_tokens if final else None,
}
try:
    client("not-a-token").responses.create(model=i["model"], input="x")
    out["refused"] = None
except openai.AuthenticationError as e:
    out["refused"] = {"status": e.status_code, "body": e.body}
try:
    c.responses.create(model=i["model"], input="x", tools=[{"type": "web_search"}])
    out["web_search"] = None
except openai.PermissionDeniedError as e:
    out["web_search"] = {"status": e.status_code, "body": e.body}
try:
    c.responses.create(model="another-model", input="x")
    out["other_model"] = None
except openai.PermissionDeniedError as e:
    out["other_model"] = {"status": e.status_code, "body": e.body}
print(json.dumps(out))
