# hako-agent: the reference in-container agent. A static binary and nothing else.
FROM scratch
COPY hako-agent /usr/local/bin/hako-agent
ENV HOME=/home/agent
USER 1000:1000
WORKDIR /workspace
# It reads its deadline from the stdin line (HAKO_WARM): runed may start it before a turn.
LABEL io.hako.warm="1"
ENTRYPOINT ["/usr/local/bin/hako-agent"]
