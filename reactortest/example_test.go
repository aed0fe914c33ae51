package reactortest_test

import (
	"context"
	"testing"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/reactortest"
)

var greet = reactor.MustDefine("greet",
	reactor.Input[string]("name", reactor.Required()),
	reactor.Step("hello", reactor.StepConfig[reactor.Args, string]{
		Run: func(ctx context.Context, in reactor.Args) (string, error) {
			name, err := reactor.Arg[string](in, "name")
			return "hello " + name, err
		},
		Args: reactor.Bindings{"name": reactor.FromInput("name")},
	}),
	reactor.Returns(reactor.FromStep("hello")))

// In a test of your own: a real Redis under the test's own prefix and queue,
// an in-process worker, and assertions on what the run did.
func ExampleNew() {
	testGreet := func(t *testing.T) {
		h := reactortest.New(t, greet)
		res, err := h.Run(context.Background(), greet, map[string]any{"name": "ada"})
		if err != nil {
			t.Fatal(err)
		}
		h.RequireStatus(t, res.RunID, reactor.StatusCompleted)
		h.RequireCompleted(t, res.RunID, "hello")
	}
	_ = testGreet // func TestGreet(t *testing.T) { testGreet(t) }
}
