# authd: hako's token authority. A static binary and nothing else.
# Mount a volume at /data (authd.db, 0600); set AUTHD_SERVICE_KEYS from a secret file.
FROM scratch
COPY authd /usr/local/bin/authd
ENV DATA_DIR=/data LISTEN_ADDR=0.0.0.0:8181
USER 1001:1001
EXPOSE 8181
HEALTHCHECK --interval=5s --timeout=6s --retries=3 CMD ["/usr/local/bin/authd", "health"]
ENTRYPOINT ["/usr/local/bin/authd"]
