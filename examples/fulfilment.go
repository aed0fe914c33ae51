package examples

import (
	"context"
	"fmt"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// Parcel is one order line of a Fulfilment.
type Parcel struct {
	Order string `json:"order"`
	Item  string `json:"item"`
}

type packIn struct {
	Parcel Parcel `json:"parcel"`
	Wave   string `json:"wave"`
}

// PackParcel is Fulfilment's element reactor: it packs one parcel and books
// its pickup, each undoable. Its input "parcel" is the map's item; "wave"
// is shared by every element.
var PackParcel = reactor.MustDefine("examples.pack_parcel",
	reactor.Input[Parcel]("parcel", reactor.Required()),
	reactor.Input[string]("wave", reactor.Required()),
	reactor.Step("pack", reactor.StepConfig[packIn, string]{
		Args: reactor.Bindings{"parcel": reactor.FromInput("parcel"), "wave": reactor.FromInput("wave")},
		Run: func(ctx context.Context, in packIn) (string, error) {
			return fmt.Sprintf("box-%s", in.Parcel.Order), nil
		},
		Undo: func(ctx context.Context, in packIn, box string) error { return nil },
	}),
	reactor.Step("pickup", reactor.StepConfig[packIn, string]{
		Args: reactor.Bindings{"parcel": reactor.FromInput("parcel"), "wave": reactor.FromInput("wave")},
		Run: func(ctx context.Context, in packIn) (string, error) {
			return fmt.Sprintf("%s/%s", in.Wave, in.Parcel.Order), nil
		},
		Undo:  func(ctx context.Context, in packIn, slot string) error { return nil },
		After: []string{"pack"},
	}),
	reactor.Returns(reactor.FromStep("pickup")),
)

// CountIn is the count step's input: the packing map's result, typed by what
// PackParcel returns (its label). Define checks the two agree.
type CountIn struct {
	Packed mapstep.Results[string] `json:"packed"`
}

// Fulfilment packs every parcel of a wave: a fan-out map step runs one
// PackParcel per parcel as its own worker task, 50 at a time per throw, then
// counts the pickups booked.
//
// When the trucks cannot be booked (input fail_trucks true), the run fails
// after the map, and the map rolls back the way it ran: one rollback job per
// packed parcel, in batches, unpacking each newest first.
//
// Inputs: wave (required), parcels (required), fail_trucks (default false).
var Fulfilment = reactor.MustDefine("examples.fulfilment",
	reactor.Input[string]("wave", reactor.Required()),
	reactor.Input[[]Parcel]("parcels", reactor.Required()),
	reactor.Input[bool]("fail_trucks", reactor.Default(false)),
	mapstep.Map("pack_all", mapstep.Config{
		Element: PackParcel,
		Items:   reactor.FromInput("parcels"),
		Input:   "parcel",
		With:    reactor.Bindings{"wave": reactor.FromInput("wave")},
		FanOut:  true,
	}),
	reactor.Step("count", reactor.StepConfig[CountIn, int]{
		Args: reactor.Bindings{"packed": reactor.FromStep("pack_all")},
		Run: func(ctx context.Context, in CountIn) (int, error) {
			n := 0
			for el, err := range in.Packed.Elements(ctx) { // lazily, 100 at a time
				if err != nil {
					return 0, err
				}
				if el.OK && el.Value != "" {
					n++
				}
			}
			return n, nil
		},
	}),
	reactor.Step("trucks", reactor.StepConfig[struct {
		Count int  `json:"count"`
		Fail  bool `json:"fail"`
	}, string]{
		Args: reactor.Bindings{"count": reactor.FromStep("count"), "fail": reactor.FromInput("fail_trucks")},
		Run: func(ctx context.Context, in struct {
			Count int  `json:"count"`
			Fail  bool `json:"fail"`
		}) (string, error) {
			if in.Fail {
				return "", reactor.Permanent(fmt.Errorf("%w: no truck free for %d parcels", ErrInjected, in.Count))
			}
			return fmt.Sprintf("%d trucks", (in.Count+99)/100), nil
		},
	}),
	reactor.Returns(reactor.FromStep("count")),
)
