# goreactor worker image.
#
#   docker build -t goreactor-worker .
#   docker run --rm goreactor-worker -redis redis://redis-host:6379/0
#
# The image holds five static binaries: /usr/local/bin/goreactor-worker (the
# entrypoint; see cmd/worker for its flags and environment variables),
# /usr/local/bin/goreactor-sweeper (cmd/sweeper; run it with
# --entrypoint /usr/local/bin/goreactor-sweeper),
# /usr/local/bin/goreactor-dashboard (cmd/dashboard; run it with
# --entrypoint /usr/local/bin/goreactor-dashboard),
# /usr/local/bin/goreactor (cmd/goreactor, the operators' CLI: continue a
# paused run, list paused runs; --entrypoint /usr/local/bin/goreactor) and
# /usr/local/bin/goreactor-demo (cmd/demo; run it with
# --entrypoint /usr/local/bin/goreactor-demo and REDIS_URL set).
#
# The worker serves the example reactors. To deploy your own, build your
# worker binary (a copy of cmd/worker that registers your definitions) the
# same way.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/goreactor-worker ./cmd/worker \
 && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/goreactor-sweeper ./cmd/sweeper \
 && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/goreactor-dashboard ./cmd/dashboard \
 && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/goreactor ./cmd/goreactor \
 && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/goreactor-demo ./cmd/demo

# distroless/static: CA certificates (for rediss://), tzdata, a nonroot user,
# no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/goreactor-worker /out/goreactor-sweeper /out/goreactor-dashboard /out/goreactor /out/goreactor-demo /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/goreactor-worker"]
