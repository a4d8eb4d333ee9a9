# Lockside sidecar image.
#
#   docker build -t lockside:0.1.0 .
#
# No Docker engine runs on the machines this project is developed on, so this file is
# not built there. To keep it from drifting, the builder runs exactly the command CI
# builds with (`cargo build --release --locked`, the last step of .ci/run), on the same
# Debian release as the runtime image (bookworm = debian12, so the same glibc). CI lints
# this file with hadolint, and tests/dockerfile.rs checks the cargo command, the user,
# the ports, the entry point and the HEALTHCHECK.

# ---- builder -------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src

# Dependencies first, in a layer of their own: it is rebuilt only when Cargo.toml,
# Cargo.lock, build.rs or the proto change, not on every source edit. protoc comes from
# the protoc-bin-vendored crate, so the image needs nothing from apt.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked \
 && rm -rf src

# The real source. COPY keeps the files' modification times from the build context,
# which can be older than the dummy build above: touch them so cargo rebuilds the crate.
COPY src ./src
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked

# ---- runtime -------------------------------------------------------------------------
# distroless/cc: glibc and libgcc_s (all the binary links), no shell, no package manager.
# The :nonroot tag runs as 65532:65532; it is repeated numerically below so that
# Kubernetes' runAsNonRoot can verify it without resolving a user name.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /src/target/release/lockside /usr/local/bin/lockside
USER 65532:65532

# glibc gives threads that allocate malloc arenas of their own (up to 8 per core), and
# pages freed in one stay in the RSS. The sidecar serves on one thread; with its helper
# threads' arenas, one holding 100,000 locks had 107 MB of RSS in half the runs of the
# bench's scale phase, 93 MB with two arenas in every run (README, Benchmark).
ENV MALLOC_ARENA_MAX=2

# 7420: gRPC (lockside.v1.LockService, grpc.health.v1, reflection).
# 7421: admin HTTP (/livez, /readyz, /metrics).
# Both listen on 127.0.0.1 by default (the binary's defaults, deliberately not
# overridden here): only the pod's own containers should reach the sidecar. The binary
# writes no files, so the container runs with a read-only root filesystem.
EXPOSE 7420 7421

# Docker only (Kubernetes ignores HEALTHCHECK and uses the pod's probes): exits 0 when
# the sidecar reports SERVING on grpc.health.v1, i.e. its lock store answers.
HEALTHCHECK CMD ["lockside", "healthcheck"]

ENTRYPOINT ["lockside"]
CMD ["serve"]
