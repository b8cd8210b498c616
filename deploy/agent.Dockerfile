# hako-agent: the reference in-container agent. A static binary and nothing else.
FROM scratch
COPY hako-agent /usr/local/bin/hako-agent
ENV HOME=/home/agent
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/hako-agent"]
