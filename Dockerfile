# syntax=docker/dockerfile:1
#
# taskledger as a container: built with the locked dependencies, run as an unprivileged user
# on a slim Debian. The image holds no PostgreSQL: give it DATABASE_URL (docker-compose.yml
# does); without one the service would try to start an embedded cluster it cannot find.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches only speed up rebuilds; the binary is copied out of them.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && cp target/release/taskledger /usr/local/bin/taskledger

FROM debian:bookworm-slim AS runtime
# curl runs the health check. Debian's stable updates are wanted here, so the version is not
# pinned (a pinned version disappears from the mirror with the next point release).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 taskledger \
    && useradd --system --uid 10001 --gid taskledger --home-dir /var/lib/taskledger \
        --create-home --shell /usr/sbin/nologin taskledger
COPY --from=build /usr/local/bin/taskledger /usr/local/bin/taskledger
USER 10001:10001
WORKDIR /var/lib/taskledger
# Two malloc arenas instead of glibc's eight per core: concurrent rating calls otherwise leave
# many arenas fragmented (the ingest benchmark's peak memory at 200,000 records: 143 MiB by
# default, 121 and 132 MiB in two runs with two arenas, at no cost in throughput).
ENV TASKLEDGER_LISTEN=0.0.0.0:8080 \
    TASKLEDGER_DATA_DIR=/var/lib/taskledger \
    RUST_LOG=info,sqlx=warn,tower_http=info \
    MALLOC_ARENA_MAX=2
EXPOSE 8080
# Ready means: the database answers and carries every migration this build needs.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["curl", "--fail", "--silent", "--show-error", "--max-time", "2", "http://127.0.0.1:8080/readyz"]
ENTRYPOINT ["taskledger"]
CMD ["serve"]
