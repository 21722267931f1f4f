# The idem command in a container: a static binary on a distroless base, run as a
# non-root user. `docker build -t idem .`; `docker compose up` runs it with PostgreSQL,
# Redis and Prometheus (compose.yaml, docs/operations.md). It runs `idem payments` unless
# told otherwise: `docker run idem proxy --upstream http://api:3000` runs the proxy in
# front of an API (docs/proxy.md; compose.yaml's idem-proxy), on the same port.
#
# Build stage: the module's dependencies first (cached while go.mod and go.sum stay the
# same), then the source; scripts/build-static is also what e2e's Docker test runs.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG BUILD_COMMIT=""
# BUILD_COMMIT (a build argument is in the environment of RUN) names the commit in
# `idem version`: the build context has no .git.
RUN scripts/build-static /out/idem && mkdir /out/data

# Run stage: distroless/static has CA certificates (for rediss:// and PostgreSQL over
# TLS), time zones, and a non-root user (65532); no shell, no package manager. It
# holds only what is copied here: the binary, and /data, where the default SQLite
# store (sqlite:idem.db, relative to the working directory) lives.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/idem /idem
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
WORKDIR /data
VOLUME /data
# Every flag can come from the environment (IDEM_<FLAG>); in a container the API must
# listen beyond loopback. Metrics stay off unless IDEM_METRICS_ADDR is set.
ENV IDEM_ADDR=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/idem"]
CMD ["payments"]
