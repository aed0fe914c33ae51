package main

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
)

// TestHardeningRedisURLNotAnswering: a REDIS_URL that does not answer exits
// 1 with a message naming the URL.
func TestHardeningRedisURLNotAnswering(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "redis://" + ln.Addr().String() + "/0"
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := run([]string{"-once"}, envOf(map[string]string{"REDIS_URL": url}), io.Discard, &out); code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), url) {
		t.Fatalf("output does not name %s:\n%s", url, out.String())
	}
}
