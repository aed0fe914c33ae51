package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/cli"
	"github.com/goreactor/goreactor/reactor"
)

// Approval is the payload an operator sends to the refund's interrupt.
type Approval struct {
	By string `json:"by"`
	OK bool   `json:"ok"`
}

// refundFlow holds a refund for an operator's approval: the interrupt
// "approve" pauses the run (its worker goes free) until a payload comes,
// continued by run id or by the refund's number as correlation id, or times
// out after a day and rolls back.
var refundFlow = reactor.MustDefine("refund",
	reactor.Input[string]("refund", reactor.Required()),
	reactor.Input[string]("amount", reactor.Required()),
	reactor.Step("hold", reactor.StepConfig[reactor.Args, string]{
		Args: reactor.Bindings{"amount": reactor.FromInput("amount")},
		Run: func(_ context.Context, in reactor.Args) (string, error) {
			amount, err := reactor.Arg[string](in, "amount")
			return "held " + amount, err
		},
	}),
	reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, Approval]{
		Args:  reactor.Bindings{"refund": reactor.FromInput("refund")},
		After: []string{"hold"},
		// The id a webhook continues the run by, besides the run id.
		Correlation: func(in reactor.Args) (string, error) {
			return reactor.Arg[string](in, "refund")
		},
		Validate: func(a Approval) error {
			if a.By == "" {
				return errors.New(`an approval names its approver ("by")`)
			}
			return nil
		},
		// No approval by then: the step fails, and the run rolls back.
		Timeout: 24 * time.Hour,
	}),
	reactor.Step("pay_out", reactor.StepConfig[reactor.Args, string]{
		Args: reactor.Bindings{"amount": reactor.FromInput("amount"), "by": reactor.FromStep("approve", "by")},
		Run: func(_ context.Context, in reactor.Args) (string, error) {
			amount, err := reactor.Arg[string](in, "amount")
			if err != nil {
				return "", err
			}
			by, err := reactor.Arg[string](in, "by")
			return fmt.Sprintf("paid out %s, approved by %s", amount, by), err
		},
	}),
	reactor.Returns(reactor.FromStep("pay_out")),
)

// refundApproved is part 6: a refund run pauses at its interrupt step and
// leaves the worker; the demo prints the goreactor command an operator
// would type, then runs that command's code (package internal/cli, on an
// engine without definitions like the command's): a payload the worker
// refuses, the approval, and a duplicate that is told it came too late.
func refundApproved(ctx context.Context, engine, operator *reactor.Engine) error {
	const refund, amount = "R-42", "EUR 30.00"
	fmt.Printf("\n6. Refund %s of %s waits for an operator's approval (an interrupt step)\n", refund, amount)
	res, err := engine.Enqueue(ctx, refundFlow, map[string]any{"refund": refund, "amount": amount}, reactor.WithRunID("refund-"+refund))
	if err != nil {
		return fmt.Errorf("part 6: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	var run *reactor.Run
	for {
		if run, err = engine.Get(wctx, res.RunID); err != nil {
			return fmt.Errorf("part 6: %w", err)
		}
		if run.Status == reactor.StatusPaused || run.Status.Terminal() {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("part 6: the run did not pause: %w", wctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if run.Paused == nil {
		return fmt.Errorf("part 6: run is %s (%v), want paused at approve", run.Status, run.Failure)
	}
	info, err := engine.Interrupt(wctx, res.RunID)
	if err != nil {
		return fmt.Errorf("part 6: %w", err)
	}
	fmt.Printf("   run %s is %s at step %q (correlation %s, times out %s); the worker is free\n",
		run.ID, run.Status, run.Paused.Step, run.Paused.Correlation, run.Paused.Deadline.UTC().Format(time.RFC3339))
	fmt.Printf("   it expects a %s, like %s; an operator types:\n", info.PayloadType, info.Example)
	approval := json.RawMessage(`{"by":"ann","ok":true}`)
	byRun := cli.Target{RunID: run.ID, Step: run.Paused.Step}
	fmt.Printf("     %s\n", cli.Command(byRun, approval, "ops:ann"))
	fmt.Printf("   or, by the refund's number:\n     %s\n", cli.Command(cli.Target{Correlation: refund}, approval, "ops:ann"))

	// The command's engine has no definitions: the worker checks payloads.
	bad := json.RawMessage(`{"ok":true}`)
	fmt.Printf("   first, one without an approver:\n     $ %s\n", cli.Command(byRun, bad, "ops:ann"))
	c, err := cli.Continue(wctx, operator, byRun, bad, "ops:ann")
	if err != nil {
		return fmt.Errorf("part 6: %s", cli.Explain(err))
	}
	fmt.Printf("     %s\n", cli.Recorded(c))
	out, err := cli.Wait(wctx, operator, c, waitTimeout)
	if err != nil || out.Refused == "" {
		return fmt.Errorf("part 6: the worker did not refuse a payload without an approver: %+v, %v", out, err)
	}
	fmt.Printf("     refused by the worker: %s (exit status 1; the run still waits)\n", out.Refused)

	fmt.Printf("   then the approval:\n     $ %s\n", cli.Command(byRun, approval, "ops:ann"))
	if c, err = cli.Continue(wctx, operator, byRun, approval, "ops:ann"); err != nil {
		return fmt.Errorf("part 6: %s", cli.Explain(err))
	}
	fmt.Printf("     %s\n", cli.Recorded(c))
	if out, err = cli.Wait(wctx, operator, c, waitTimeout); err != nil || !out.Taken {
		return fmt.Errorf("part 6: the worker did not take the approval: %+v, %v", out, err)
	}
	fmt.Printf("     taken: run %s went on past %s and is %s\n", c.RunID, c.Step, out.Status)
	final, err := engine.Wait(wctx, res.RunID)
	if err != nil {
		return fmt.Errorf("part 6: %w", err)
	}
	got, err := reactor.ValueOf[string](final)
	if err != nil || final.Status != reactor.StatusCompleted {
		return fmt.Errorf("part 6: run ended %s (%v, %v), want completed", final.Status, final.Err(), err)
	}
	fmt.Printf("   => %s: %s\n", final.Status, got)

	// Exactly once: a second approval by correlation id is told when the
	// first came.
	_, err = cli.Continue(wctx, operator, cli.Target{Correlation: refund}, json.RawMessage(`{"by":"bob","ok":true}`), "ops:bob")
	if !errors.Is(err, reactor.ErrAlreadyContinued) {
		return fmt.Errorf("part 6: a second approval: %v, want already continued", err)
	}
	fmt.Printf("   a second approval, by bob: %s\n", cli.Explain(err))
	return nil
}
