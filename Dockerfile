# syntax=docker/dockerfile:1
# The bgtask binary (and bgtask-shim, the small parent of the commands) in an image for engines and workers. Workers run commands with
# bash in the login environment of the image's user: add what your tasks need
# (compilers, git, ...) in an image built FROM this one.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/bgtask ./cmd/bgtask-shim

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash ca-certificates procps \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 bgtask \
 && mkdir -p /var/lib/bgtask && chown bgtask:bgtask /var/lib/bgtask
COPY --from=build /out/bgtask /out/bgtask-shim /usr/local/bin/
USER bgtask
WORKDIR /home/bgtask
ENTRYPOINT ["bgtask"]
CMD ["--help"]
