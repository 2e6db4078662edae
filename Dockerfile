# Multi-stage build: compile in the Rust image, run in a slim Debian image as a non-root user.
#   docker build -t tollgate .
#   docker run -p 8080:8080 -v $PWD/proxy.yaml:/etc/tollgate/proxy.yaml:ro \
#     -e REDIS_URL=redis://redis:6379/0 tollgate
# The toolchain whose LLVM wrote pgo/tollgate.profdata (pgo/llvm-version): the release build is
# profile-guided with it, and a plain release build with any other (pgo/README.md).
FROM rust:1.95-slim-bookworm AS build
# make: jemalloc (the global allocator) is built from its C sources by configure and make
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY pgo pgo
COPY src src
COPY lua lua
COPY benches benches
RUN cargo build --release --locked --bin tollgate \
 && strip target/release/tollgate

FROM debian:bookworm-slim
# ca-certificates: the system roots that rediss:// and https:// targets are checked against
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin tollgate
COPY --from=build /src/target/release/tollgate /usr/local/bin/tollgate
# The shipped example; mount your own over it.
COPY proxy.yaml /etc/tollgate/proxy.yaml
ENV TOLLGATE_CONFIG=/etc/tollgate/proxy.yaml
USER tollgate
EXPOSE 8080 9901
ENTRYPOINT ["/usr/local/bin/tollgate"]
