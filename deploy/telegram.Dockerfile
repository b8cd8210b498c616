# hako-telegram: the Telegram channel adapter (specs/channels.md). A static binary, and the CA
# bundle it verifies api.telegram.org with. Its database (offset, outbox) lives in /data.
FROM scratch
COPY hako-telegram /usr/local/bin/hako-telegram
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV TELEGRAM_DB=/data/telegram.db TELEGRAM_LISTEN=0.0.0.0:8190 SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
EXPOSE 8190
HEALTHCHECK --interval=5s --timeout=6s --retries=3 CMD ["/usr/local/bin/hako-telegram", "health"]
ENTRYPOINT ["/usr/local/bin/hako-telegram"]
