package dashboard_test

import (
	"log"
	"net/http"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/dashboard"
)

// Mount the dashboard in any binary: its JSON API under /api/ and the
// collector at /metrics. With no token its actions are refused.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	h, err := dashboard.New(dashboard.Config{Client: rdb, Token: os.Getenv("GOREACTOR_DASHBOARD_TOKEN")})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", h)
	mux.Handle("/metrics", h)
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	_ = srv // srv.ListenAndServe()
}
