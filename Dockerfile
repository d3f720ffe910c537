# syntax=docker/dockerfile:1.7
# cursor-server in a container. The Cursor schema is mounted at build time from a build context
# named `schema` — a schema directory (with agent_v1.proto) or a Cursor install — and never copied
# into any image layer:
#
#   docker build --build-context schema=/path/to/proto -t cursor-byok .
#   docker build --build-context schema=/usr/share/cursor -t cursor-byok .
#
# See docs/deployment.md for running it (config, database volume, loopback-only port).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=bind,from=schema,target=/schema,readonly \
    --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    if [ -f /schema/agent_v1.proto ]; then export CURSOR_PROTO_DIR=/schema; \
    else export CURSOR_APP_DIR=/schema; fi \
    && cargo build --release --locked -p cursor-server \
    && install -m 0755 target/release/cursor-server /usr/local/bin/cursor-server

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin cursorbyok \
    && mkdir -p /data /config \
    && chown cursorbyok:cursorbyok /data
COPY --from=build /usr/local/bin/cursor-server /usr/local/bin/cursor-server
# Inside the container the server must listen on all of the container's interfaces; publish the
# port on the host's loopback only (docker run -p 127.0.0.1:3000:3000).
ENV CURSOR_BYOK_LISTEN=0.0.0.0:3000 \
    CURSOR_BYOK_DATABASE_URL=sqlite:///data/cursor-byok.db \
    CURSOR_BYOK_CONFIG=/config/cursor-byok.toml
VOLUME ["/data"]
EXPOSE 3000
USER cursorbyok
HEALTHCHECK --interval=30s --timeout=5s CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/3000 && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q ' 200 ' <&3"]
ENTRYPOINT ["/usr/local/bin/cursor-server"]
