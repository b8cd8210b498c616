# hako-egress: the egress proxy of allowlist groups. A static binary and the system's CA bundle
# (the roots it verifies targets against when it brokers secrets, and hands to boxes). runed
# starts it (one per install), on the networks of RUNED_EGRESS_NETWORKS and each allowlist
# run's, with the operator's secrets mounted read-only and a directory of its own for its CA.
FROM scratch
COPY egress /usr/local/bin/egress
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV EGRESS_LISTEN=0.0.0.0:3128 EGRESS_ADMIN_LISTEN=0.0.0.0:3129
USER 65534:65534
EXPOSE 3128 3129
ENTRYPOINT ["/usr/local/bin/egress"]
