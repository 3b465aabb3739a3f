# syntax=docker/dockerfile:1
# The singleton-controller image: a release build of the controller on distroless, as non-root.
#
#   docker build -t <registry>/singleton-controller:0.1.0 .
#
# Build stage: the official Rust image; --locked builds exactly Cargo.lock.
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p singleton-controller --bin singleton-controller \
    && install -D -m 0755 target/release/singleton-controller /out/singleton-controller

# Runtime stage: distroless "cc" (glibc, libgcc, CA certificates for TLS to the backstop
# database; no shell, no package manager). The binary links glibc dynamically, hence cc rather
# than static. No tzdata package is needed: the IANA time zone database is compiled into the
# binary (jiff's tzdb-bundle-always feature), so `spec.timeZone` works the same everywhere.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/singleton-controller /usr/local/bin/singleton-controller
# 65532 = distroless "nonroot"; numeric, so runAsNonRoot can verify it.
USER 65532:65532
# /healthz, /readyz and /metrics (--health-addr).
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/singleton-controller"]
