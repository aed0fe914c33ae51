// Command otlp is a goreactor worker that exports its traces over OTLP
// (gRPC), the way most tracing backends (Jaeger, Tempo, Honeycomb, an
// OpenTelemetry Collector) take them. It is a module of its own so that
// goreactor itself never depends on gRPC: copy this file into your worker.
//
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 OTEL_SERVICE_NAME=checkout-worker \
//	  go run . -redis redis://localhost:6379/0
//
// The exporter reads the standard OTEL_EXPORTER_OTLP_* variables (endpoint,
// headers, TLS); the worker's flags are worker.Main's. Every run, step,
// element task, rollback job and sweeper pass becomes a span, and one run
// is one trace across all the workers that touch it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "otlp worker:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	exporter, err := otlptracegrpc.New(ctx)
	if err != nil {
		return fmt.Errorf("OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.Environment())
	if err != nil {
		return fmt.Errorf("resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	defer func() {
		// Flush what is batched before the process ends.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}()
	// Your own HTTP handlers and clients propagate the same W3C context.
	otel.SetTextMapPropagator(propagation.TraceContext{})

	return worker.Run(ctx, worker.Options{
		Definitions: []*reactor.Definition{examples.Checkout, examples.Travel, examples.Trip, examples.Fulfilment},
		Args:        os.Args[1:],
		Engine:      func(c *reactor.Config) { c.TracerProvider = tp },
	})
}
