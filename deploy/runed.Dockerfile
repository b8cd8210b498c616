# runed: hako's execution daemon, the only holder of the Docker socket.
# Mount the Docker socket and the data dir (with HOST_DATA_DIR set to its host path, so bind
# sources are translated for the host's daemon).
FROM scratch
COPY runed /usr/local/bin/runed
ENV DATA_DIR=/data RUNED_LISTEN=0.0.0.0:8182
EXPOSE 8182
HEALTHCHECK --interval=5s --timeout=6s --retries=3 CMD ["/usr/local/bin/runed", "health"]
ENTRYPOINT ["/usr/local/bin/runed"]
