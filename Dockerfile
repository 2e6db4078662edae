# Multi-stage build: compile in the Rust image, run in a slim Debian image as a non-root user.
#   docker build -t tollgate .
# To run it beside Redis and an API on one network, see docs/operations.md ("Docker").
#
# The toolchain is pinned to the one whose LLVM wrote pgo/tollgate.profdata, so pgo/build
# applies the profile. pgo/build says loudly when it does not.
FROM rust:1.95.0-slim-bookworm AS build
# make: jemalloc (the global allocator) is built from its C sources by configure and make
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY pgo pgo
COPY src src
COPY lua lua
COPY benches benches
RUN bin=$(pgo/build --locked | tail -n 1) \
 && strip "$bin" \
 && cp "$bin" /tollgate

FROM debian:bookworm-slim
# ca-certificates: the system roots that rediss:// and https:// targets are checked against
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin tollgate
COPY --from=build /tollgate /usr/local/bin/tollgate
# The shipped example; mount your own over it.
COPY proxy.yaml /etc/tollgate/proxy.yaml
ENV TOLLGATE_CONFIG=/etc/tollgate/proxy.yaml
USER tollgate
EXPOSE 8080 9901
ENTRYPOINT ["/usr/local/bin/tollgate"]
