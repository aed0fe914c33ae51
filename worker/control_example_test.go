package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// An operator's cancel, from a process that holds no reactor definitions
// (a dashboard, an admin tool): the Controller checks the stored run and
// queues a control task, which a worker carries out.
func ExampleController_Request() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ctl, err := worker.NewController(ctx, worker.ControllerConfig{Client: rdb})
	if err != nil {
		log.Fatal(err)
	}
	req, err := ctl.Request(ctx, "order-42", worker.ActionCancel)
	var refused *reactor.StatusError
	switch {
	case errors.Is(err, reactor.ErrNotFound):
		fmt.Println("no such run")
	case errors.As(err, &refused):
		fmt.Println("refused:", refused) // the engine's reason, e.g. already finished
	case err != nil:
		log.Fatal(err)
	case req.Duplicate:
		fmt.Println("already requested:", req.TaskID)
	default:
		fmt.Println("queued:", req.TaskID)
	}
}
