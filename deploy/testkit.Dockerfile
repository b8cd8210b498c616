# hako-testkit: test-only (the egress tests and bench). The targets, the proxy-aware client
# and a minimal agent that speaks the container contract, in one static binary.
FROM scratch
COPY hako-testkit /usr/local/bin/hako-testkit
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/hako-testkit"]
