# hako-toolbox: test-only. The test kit's binary (its agent runs each command in a shell) and
# the clients agents run, from the build machine's Debian packages with the libraries they
# link: busybox, curl, git (its HTTPS helper and git http-backend), Python 3.11 with requests
# and httpx, node. Nothing is fetched: every file is the build machine's.
FROM scratch
COPY lib/ /lib/x86_64-linux-gnu/
COPY ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2
COPY bin/ /bin/
COPY usr/ /usr/
COPY etc/ /etc/
COPY hako-testkit /usr/local/bin/hako-testkit
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/ln", "-s", "python3.11", "/usr/bin/python3"]
RUN ["/bin/ln", "-s", "git-remote-http", "/usr/lib/git-core/git-remote-https"]
RUN ["/bin/ln", "-s", "git", "/usr/lib/git-core/git-upload-pack"]
RUN ["/bin/ln", "-s", "git", "/usr/bin/git-upload-pack"]
ENV PATH=/usr/local/bin:/usr/bin:/bin HOME=/home/agent LANG=C.UTF-8
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/hako-testkit"]
