# hako-egress: the egress proxy of allowlist groups. A static binary and nothing else; it
# holds no secret (authd's public keys and revocation list are all it reads). runed starts
# it (one per install), on the networks of RUNED_EGRESS_NETWORKS and each allowlist run's.
FROM scratch
COPY egress /usr/local/bin/egress
ENV EGRESS_LISTEN=0.0.0.0:3128 EGRESS_ADMIN_LISTEN=0.0.0.0:3129
USER 65534:65534
EXPOSE 3128 3129
ENTRYPOINT ["/usr/local/bin/egress"]
