package examples

import (
	"context"

	"github.com/goreactor/goreactor/reactor"
)

// Seat is a booked flight seat.
type Seat struct {
	Flight string `json:"flight"`
	Seat   string `json:"seat"`
	Price  Cents  `json:"price"`
}

// Room is a booked hotel room.
type Room struct {
	Hotel        string `json:"hotel"`
	Confirmation string `json:"confirmation"`
	Nights       int    `json:"nights"`
	Price        Cents  `json:"price"`
}

// Itinerary is what a completed Travel returns.
type Itinerary struct {
	Trip   string `json:"trip"`
	Flight Seat   `json:"flight"`
	Hotel  Room   `json:"hotel"`
	Total  Cents  `json:"total"`
}

// TripReceipt is what a completed Trip returns.
type TripReceipt struct {
	Itinerary Itinerary `json:"itinerary"`
	Payment   Payment   `json:"payment"`
}

type flightIn struct {
	Trip   string `json:"trip"`
	From   string `json:"from"`
	To     string `json:"to"`
	FailAt string `json:"fail_at"`
}

type hotelIn struct {
	Trip   string `json:"trip"`
	City   string `json:"city"`
	Nights int    `json:"nights"`
	FailAt string `json:"fail_at"`
}

type itineraryIn struct {
	Trip   string `json:"trip"`
	Flight Seat   `json:"flight"`
	Hotel  Room   `json:"hotel"`
}

type payIn struct {
	Trip      string    `json:"trip"`
	Itinerary Itinerary `json:"itinerary"`
	Card      string    `json:"card"`
	FailAt    string    `json:"fail_at"`
}

// Travel books a flight and then a hotel at the destination, and returns
// the Itinerary. It runs on its own or, as in Trip, composed into a larger
// reactor.
//
// Inputs: trip (required, the trip id), from and to (required), nights
// (default 2), fail_at ("flight" or "hotel"; other values fail nothing).
var Travel = reactor.MustDefine("travel",
	reactor.Input[string]("trip", reactor.Required()),
	reactor.Input[string]("from", reactor.Required()),
	reactor.Input[string]("to", reactor.Required()),
	reactor.Input[int]("nights", reactor.Default(2)),
	// Not validated: a parent passes its own fail_at through, which may name
	// one of its steps rather than one of these.
	reactor.Input[string]("fail_at", reactor.Default("")),

	reactor.Step("flight", reactor.StepConfig[flightIn, Seat]{
		Args: reactor.Bindings{
			"trip":    reactor.FromInput("trip"),
			"from":    reactor.FromInput("from"),
			"to":      reactor.FromInput("to"),
			"fail_at": reactor.FromInput("fail_at"),
		},
		Run: func(ctx context.Context, in flightIn) (Seat, error) {
			if err := injectFailure(in.FailAt, "flight"); err != nil {
				return Seat{}, err
			}
			s := Seat{Flight: "GR412", Seat: "14C", Price: 18900}
			Effects.Record(ctx, in.Trip, "flight", "seat %s on %s, %s → %s, %s", s.Seat, s.Flight, in.From, in.To, s.Price)
			return s, nil
		},
		Undo: func(ctx context.Context, in flightIn, s Seat) error {
			Effects.Record(ctx, in.Trip, "cancel", "seat %s on %s", s.Seat, s.Flight)
			return nil
		},
	}),

	reactor.Step("hotel", reactor.StepConfig[hotelIn, Room]{
		Args: reactor.Bindings{
			"trip":    reactor.FromInput("trip"),
			"city":    reactor.FromInput("to"),
			"nights":  reactor.FromInput("nights"),
			"fail_at": reactor.FromInput("fail_at"),
		},
		// No argument refers to the flight; After orders the bookings so
		// nobody sits in a hotel they cannot fly to.
		After: []string{"flight"},
		Run: func(ctx context.Context, in hotelIn) (Room, error) {
			if err := injectFailure(in.FailAt, "hotel"); err != nil {
				return Room{}, err
			}
			r := Room{Hotel: "Hotel " + in.City, Confirmation: "H-" + in.Trip, Nights: in.Nights, Price: 11000 * Cents(in.Nights)}
			Effects.Record(ctx, in.Trip, "hotel", "%d nights at %s (%s), %s", r.Nights, r.Hotel, r.Confirmation, r.Price)
			return r, nil
		},
		Undo: func(ctx context.Context, in hotelIn, r Room) error {
			Effects.Record(ctx, in.Trip, "cancel", "%s (%s)", r.Hotel, r.Confirmation)
			return nil
		},
	}),

	// A step without Undo has nothing to reverse and stays off the ledger.
	reactor.Step("itinerary", reactor.StepConfig[itineraryIn, Itinerary]{
		Args: reactor.Bindings{
			"trip":   reactor.FromInput("trip"),
			"flight": reactor.FromStep("flight"),
			"hotel":  reactor.FromStep("hotel"),
		},
		Run: func(_ context.Context, in itineraryIn) (Itinerary, error) {
			return Itinerary{Trip: in.Trip, Flight: in.Flight, Hotel: in.Hotel, Total: in.Flight.Price + in.Hotel.Price}, nil
		},
	}),

	reactor.Returns(reactor.FromStep("itinerary")),
)

// Trip books a journey with Travel, composed as its step "book", then pays
// for it, and returns a TripReceipt. Travel's flight and hotel fold into
// Trip's ledger: when "pay" fails, or the trip is undone with Engine.Undo,
// the payment is refunded, then the hotel and the flight are cancelled.
//
// Inputs: trip (required, the trip id), from and to (required), nights
// (default 2), card (default a test card), fail_at ("flight", "hotel" or
// "pay").
var Trip = reactor.MustDefine("trip",
	reactor.Input[string]("trip", reactor.Required()),
	reactor.Input[string]("from", reactor.Required()),
	reactor.Input[string]("to", reactor.Required()),
	reactor.Input[int]("nights", reactor.Default(2)),
	reactor.Input[string]("card", reactor.Default("4242424242424242")),
	reactor.Input[string]("fail_at", reactor.Default(""), validFailAt("flight", "hotel", "pay")),

	reactor.Compose("book", Travel, reactor.ComposeConfig{
		Args: reactor.Bindings{
			"trip":    reactor.FromInput("trip"),
			"from":    reactor.FromInput("from"),
			"to":      reactor.FromInput("to"),
			"nights":  reactor.FromInput("nights"),
			"fail_at": reactor.FromInput("fail_at"),
		},
	}),

	reactor.Step("pay", reactor.StepConfig[payIn, TripReceipt]{
		Args: reactor.Bindings{
			"trip":      reactor.FromInput("trip"),
			"itinerary": reactor.FromStep("book"),
			"card":      reactor.FromInput("card"),
			"fail_at":   reactor.FromInput("fail_at"),
		},
		Run: func(ctx context.Context, in payIn) (TripReceipt, error) {
			if err := injectFailure(in.FailAt, "pay"); err != nil {
				return TripReceipt{}, err
			}
			return TripReceipt{Itinerary: in.Itinerary, Payment: charge(ctx, in.Trip, in.Card, in.Itinerary.Total)}, nil
		},
		Undo: func(ctx context.Context, in payIn, r TripReceipt) error {
			refund(ctx, in.Trip, r.Payment)
			return nil
		},
	}),

	reactor.Returns(reactor.FromStep("pay")),
)
