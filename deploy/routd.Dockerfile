# routd: hako's routing daemon (the message log, groups, turns, the turn's sockets). A static
# binary, and the CA bundle its LLM gateway verifies the providers' TLS with.
# Mount the data directory runed uses (the turn's sockets live in its folders' ipc/).
FROM scratch
COPY routd /usr/local/bin/routd
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV DATA_DIR=/data ROUTD_LISTEN=0.0.0.0:8183 SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
EXPOSE 8183
HEALTHCHECK --interval=5s --timeout=6s --retries=3 CMD ["/usr/local/bin/routd", "health"]
ENTRYPOINT ["/usr/local/bin/routd"]
