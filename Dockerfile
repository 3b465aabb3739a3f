# syntax=docker/dockerfile:1
# The singleton-controller image: a release build of the controller on distroless, as non-root.
#
#   docker build -t <registry>/singleton-controller:0.1.0 .
#
# Base images are pinned by digest, so a rebuild uses the bytes that were reviewed, not whatever a
# tag points at today; the tag stays for readers. To bump (docs/security.md, "Supply chain"):
#   docker buildx imagetools inspect rust:1.95-bookworm   (or: crane digest rust:1.95-bookworm)
# and the same for gcr.io/distroless/cc-debian12:nonroot, then replace both digests below.
#
# Build stage: the official Rust image, the toolchain the repository is tested with (1.95);
# --locked builds exactly Cargo.lock.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS builder
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
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=builder /out/singleton-controller /usr/local/bin/singleton-controller
# 65532 = distroless "nonroot"; numeric, so runAsNonRoot can verify it.
USER 65532:65532
# /healthz, /readyz and /metrics (--health-addr).
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/singleton-controller"]
