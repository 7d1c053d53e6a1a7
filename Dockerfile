# summaryd container image: one binary, every role; pick roles with the command
# (`serve --roles api`, `serve --roles worker`, `migrate`, ...).
#
#   docker build -t summaryd:dev .
#   docker run --rm -p 8080:8080 \
#     -e SUMMARYD_DATABASE_URL=postgres://... -e SUMMARYD_REDIS_URL=redis://... summaryd:dev

# ---- build ------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src

# Dependency layer: build every dependency against stub sources, so this slow step is
# cached until Cargo.toml or Cargo.lock change, not on every source edit. The stub's own
# artifacts are deleted afterwards so the real build below cannot mistake them for current.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked \
 && rm -rf src \
 && rm -rf target/release/summaryd target/release/deps/summaryd-* \
           target/release/deps/libsummaryd-* target/release/.fingerprint/summaryd-*

# Real sources (.dockerignore keeps target/, .git and docs out of the context). Migrations
# are embedded into the binary at compile time, so the runtime image needs no SQL files.
COPY . .
RUN cargo build --release --locked --bin summaryd \
 && strip target/release/summaryd

# ---- runtime ----------------------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: TLS to the model API, SMTP and HTTP mail providers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 summaryd \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin summaryd

COPY --from=builder /src/target/release/summaryd /usr/local/bin/summaryd
# The documented defaults, for reference or as a base: use it with SUMMARYD_CONFIG or
# --config; mount your own over /etc/summaryd/summaryd.toml.
COPY config/summaryd.toml /etc/summaryd/summaryd.toml

# Numeric user so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
# Inside a container the listener must not be loopback-only.
ENV SUMMARYD_LISTEN=0.0.0.0:8080
EXPOSE 8080
# summaryd runs as PID 1 and handles SIGTERM itself (stop taking work, drain for
# SUMMARYD_SHUTDOWN_GRACE_MS), so no init shim is needed.
ENTRYPOINT ["summaryd"]
CMD ["serve"]
