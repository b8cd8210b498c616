"""The official MCP Python SDK (`mcp` on PyPI) as an agent's client of a turn's socket.

Agents that only speak stdio MCP reach the socket through a bridge (socat, in the seeds);
here the bridge is a few lines of Python, started by the SDK's own stdio client. Input on
stdin: {"socket": PATH, "text": TEXT}. Output: one JSON object of what the SDK saw.
"""
import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BRIDGE = r"""
import socket, sys, threading
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def up():
    while True:
        b = sys.stdin.buffer.read1(65536)
        if not b:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(b)
threading.Thread(target=up, daemon=True).start()
while True:
    b = s.recv(65536)
    if not b:
        break
    sys.stdout.buffer.write(b)
    sys.stdout.buffer.flush()
"""


async def main(args):
    params = StdioServerParameters(command=sys.executable, args=["-c", BRIDGE, args["socket"]])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            sent = await session.call_tool("send_message", {"text": args["text"]})
            refused = await session.call_tool("spawn_group", {"folder": "elsewhere/x", "prompt": "p"})
            return {
                "protocol": str(getattr(init, "protocol_version", getattr(init, "protocolVersion", ""))),
                "server": init.server_info.name if getattr(init, "server_info", None) else None,
                "tools": [
                    {"name": t.name, "description": t.description, "schema": t.input_schema}
                    for t in tools.tools
                ],
                "sent": {
                    "is_error": bool(sent.is_error),
                    "text": [c.text for c in sent.content if getattr(c, "type", "") == "text"],
                    "structured": sent.structured_content,
                },
                "refused": {
                    "is_error": bool(refused.is_error),
                    "text": [c.text for c in refused.content if getattr(c, "type", "") == "text"],
                },
            }


print(json.dumps(asyncio.run(main(json.load(sys.stdin)))))
