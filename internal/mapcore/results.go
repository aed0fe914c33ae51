package mapcore

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/typename"
)

// Results is a completed map step's result, typed by what its element
// reactor returns: bind the map step to a field of this type and read the
// elements from it, lazily, a chunk at a time, in index order.
//
//	type CountIn struct {
//		Packed mapstep.Results[Label] `json:"packed"`
//	}
//	reactor.Step("count", reactor.StepConfig[CountIn, int]{
//		Args: reactor.Bindings{"packed": reactor.FromStep("pack_all")},
//		Run: func(ctx context.Context, in CountIn) (int, error) {
//			labels, err := in.Packed.Values(ctx)
//			return len(labels), err
//		},
//	})
//
// reactor.Define refuses a Results[T] whose T is not the type the element
// reactor returns (its Returns step's Out type). Reading needs the engine:
// inside a step it comes from the step's context; elsewhere use Reader with
// ReadWith.
type Results[T any] struct {
	r Result
}

// Len is the number of elements.
func (r Results[T]) Len() int { return r.r.Total }

// Failed is the number of elements that failed (a partial map; an atomic
// map with a failure fails instead of completing).
func (r Results[T]) Failed() int { return r.r.Failed }

// Result is the untyped result (its map id, size and failure count).
func (r Results[T]) Result() Result { return r.r }

// Elements iterates over every element's outcome, in index order, reading
// 100 at a time; it stops at the first read error, which it yields.
func (r Results[T]) Elements(ctx context.Context) iter.Seq2[Element[T], error] {
	return func(yield func(Element[T], error) bool) {
		rd, err := Read[T](ctx, r.r)
		if err != nil {
			yield(Element[T]{}, err)
			return
		}
		for {
			el, ok, err := rd.Next(ctx)
			if err != nil {
				yield(el, err)
				return
			}
			if !ok || !yield(el, nil) {
				return
			}
		}
	}
}

// All reads every element's outcome (convenient for small maps; a big map
// is better walked with Elements).
func (r Results[T]) All(ctx context.Context) ([]Element[T], error) {
	out := make([]Element[T], 0, r.r.Total)
	for el, err := range r.Elements(ctx) {
		if err != nil {
			return nil, err
		}
		out = append(out, el)
	}
	return out, nil
}

// Values reads the values of the elements that completed, in index order
// (every element of an atomic map; a partial map's failed, halted and
// skipped elements have none and are left out).
func (r Results[T]) Values(ctx context.Context) ([]T, error) {
	out := make([]T, 0, r.r.Total-r.r.Failed)
	for el, err := range r.Elements(ctx) {
		if err != nil {
			return nil, err
		}
		if el.OK {
			out = append(out, el.Value)
		}
	}
	return out, nil
}

// DecodeMsgpack decodes a map step's result.
func (r *Results[T]) DecodeMsgpack(dec *msgpack.Decoder) error { return dec.Decode(&r.r) }

// EncodeMsgpack encodes it as the map step's result.
func (r Results[T]) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.Encode(r.r) }

// elementType is what CheckBinding compares with the element reactor's
// result type.
func (Results[T]) elementType() reflect.Type { return reflect.TypeFor[T]() }

var resultType = reflect.TypeFor[Result]()

// ResultType is the map step's result type (reactor.Definition.ResultType
// of an owner returning it).
func (m *construct) ResultType() reflect.Type { return resultType }

// CheckBinding is called by reactor.Define for a step that binds this map's
// whole result to a field of type field: a Results[T] whose T differs from
// what the element reactor returns is refused, as is a field that is
// neither a Results nor a Result.
func (m *construct) CheckBinding(field reflect.Type) error {
	typed, ok := reflect.Zero(field).Interface().(interface{ elementType() reflect.Type })
	switch {
	case ok:
		want := m.cfg.Element.ResultType()
		got := typed.elementType()
		if want != nil && got != want && got.Kind() != reflect.Interface {
			return fmt.Errorf("the elements of this map (reactor %q) return %s; read them as mapstep.Results[%s], not %s",
				m.cfg.Element.Name(), typename.Of(want), typename.Of(want), typename.Of(field))
		}
		return nil
	case field == resultType, field.Kind() == reflect.Interface:
		return nil
	}
	return errors.New("a map step's result binds to a mapstep.Results[T] field (or a mapstep.Result), not " + typename.Of(field))
}

var _ engine.BindingChecker = (*construct)(nil)
