# hako-claude: hako-agent with the real Claude Code (its `claude` brain by default), and what
# Claude Code and its Bash tool need. FROM scratch: glibc's pieces from the build machine,
# bash, busybox's tools (linked in by busybox itself), ripgrep, and the pinned `claude`.
FROM scratch
COPY lib/ /lib/x86_64-linux-gnu/
COPY ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2
COPY bin/ /bin/
COPY etc/ /etc/
COPY claude /usr/local/bin/claude
COPY hako-agent /usr/local/bin/hako-agent
RUN ["/bin/busybox", "--install", "-s", "/bin"]
ENV PATH=/usr/local/bin:/bin HOME=/home/agent SHELL=/bin/bash HAKO_BRAIN=claude
USER 1000:1000
WORKDIR /workspace
# It reads its deadline from the stdin line (HAKO_WARM): runed may start it before a turn.
LABEL io.hako.warm="1"
# Served to its boxes from the host's page cache (runner/src/programs.rs).
LABEL io.hako.preload="/usr/local/bin/claude"
ENTRYPOINT ["/usr/local/bin/hako-agent"]
