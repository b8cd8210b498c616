"""The official Anthropic Python SDK (`anthropic` on PyPI) as an agent's client of a turn's
LLM gateway, over the unix socket (httpx's `uds` transport), with the run's spawn token as its
API key. Input on stdin: {"socket": PATH, "token": TOKEN}. Output: one JSON object of what
the SDK saw.
"""
import json
import sys

import anthropic
import httpx2

i = json.load(sys.stdin)


def client(key):
    return anthropic.Anthropic(
        api_key=key,
        base_url="http://gateway",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.HTTPTransport(uds=i["socket"])),
    )


out = {}
c = client(i["token"])
msg = c.messages.create(
    model="claude-stub-1",
    max_tokens=50,
    messages=[{"role": "user", "content": "from the sdk"}],
)
out["plain"] = {
    "text": msg.content[0].text,
    "stop_reason": msg.stop_reason,
    "input_tokens": msg.usage.input_tokens,
}
with c.messages.stream(
    model="claude-stub-1",
    max_tokens=50,
    messages=[{"role": "user", "content": "streamed"}],
) as s:
    pieces = list(s.text_stream)
    final = s.get_final_message()
out["stream"] = {
    "pieces": pieces,
    "stop_reason": final.stop_reason,
    "output_tokens": final.usage.output_tokens,
}
try:
    client("not-a-token").messages.create(
        model="claude-stub-1",
        max_tokens=5,
        messages=[{"role": "user", "content": "x"}],
    )
    out["refused"] = None
except anthropic.AuthenticationError as e:
    out["refused"] = {"status": e.status_code, "body": e.body}
print(json.dumps(out))
