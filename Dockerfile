# summaryd container image: one binary, every role; pick roles with the command
# (`serve --roles api`, `serve --roles worker`, `migrate`, ...).
#
#   docker build -t summaryd:dev .
#   docker run --rm -p 127.0.0.1:8080:8080 -v "$PWD/tokens.toml:/etc/summaryd/tokens.toml:ro" \
#     -e SUMMARYD_AUTH_TOKENS_FILE=/etc/summaryd/tokens.toml \
#     -e SUMMARYD_DATABASE_URL='postgres://...?sslmode=verify-full' \
#     -e SUMMARYD_REDIS_URL='rediss://...' summaryd:dev
#
# The api listens on 0.0.0.0 here, so without a tokens file `serve` exits 2 naming
# SUMMARYD_AUTH_MODE: unauthenticated header mode must be asked for (-e
# SUMMARYD_AUTH_MODE=header), and only behind a proxy that sets X-Tenant-Id itself.
#
# Checked in CI without a container engine (scripts/check-deploy.sh): hadolint lints this
# file, and CI runs the very build command of the stage below (`cargo build --release
# --locked --bin summaryd`, read from this file) and checks that the binary it builds has
# the `healthcheck` subcommand HEALTHCHECK uses, so a change that breaks the image's build
# breaks CI too. Keep that RUN line as it is, or change scripts/check-deploy.sh with it.
# Not covered without an engine: the base images and the apt-get step.
#
# Base images are pinned by digest, so a rebuild uses the bytes that were reviewed, not
# whatever the tag points to that day. To move to a newer base, resolve the tag's current
# digest (`docker buildx imagetools inspect rust:1-bookworm`) and replace both below.

# ---- build ------------------------------------------------------------------------------
FROM rust:1-bookworm@sha256:93ce27a88655056a51dbdd8f5f2d7ddc071c7b0070fb288a37b5a285fc83971e AS builder
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
FROM debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251
# Pre-defined OCI annotation keys. The version is Cargo.toml's (scripts/check-deploy.sh
# fails when they differ); pass the commit with --build-arg VCS_REF=$(git rev-parse HEAD).
ARG VCS_REF=unknown
LABEL org.opencontainers.image.title="summaryd" \
      org.opencontainers.image.description="Reliable plumbing around an LLM step: idempotent intake, at-least-once queue, exactly-once effects" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim" \
      org.opencontainers.image.base.digest="sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251"
# ca-certificates: TLS to the model API, SMTP and HTTP mail providers. Not pinned: a rebuild
# should pick up the distribution's current CA bundle and its security fixes.
# hadolint ignore=DL3008
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
# Inside a container the listener must not be loopback-only. The ops routes (/healthz,
# /readyz, /metrics, /openapi.json) get their own port, so publishing 8080 exposes /v1 only
# and health details and metrics stay on a port only probes and Prometheus need to reach.
ENV SUMMARYD_LISTEN=0.0.0.0:8080
ENV SUMMARYD_OPS_LISTEN=0.0.0.0:9090
EXPOSE 8080 9090
# GET /healthz with the binary itself (on SUMMARYD_OPS_LISTEN when set, else
# SUMMARYD_LISTEN): the image has no curl or wget.
# Liveness only (never a dependency check), so an outage of Redis or Postgres does not mark
# every container unhealthy. Kubernetes ignores HEALTHCHECK and uses the manifests' probes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["summaryd", "healthcheck", "--timeout-ms", "2000"]
# summaryd runs as PID 1 and handles SIGTERM itself (stop taking work, drain for
# SUMMARYD_SHUTDOWN_GRACE_MS), so no init shim is needed.
ENTRYPOINT ["summaryd"]
CMD ["serve"]
