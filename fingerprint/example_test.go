package fingerprint_test

import (
	"errors"
	"fmt"
	"math"

	"github.com/goreactor/goreactor/fingerprint"
)

func ExampleOf() {
	type account struct {
		ID      string `json:"id"`
		Balance int64  `json:"balance"`
	}
	// A struct, and the same state as the codec reads it back from Redis.
	a, _ := fingerprint.Of(account{ID: "acc-1", Balance: 120})
	b, _ := fingerprint.Of(map[string]any{"id": "acc-1", "balance": int8(120)})
	fmt.Println(a == b)
	fmt.Println(a[:len(fingerprint.Prefix)])
	// Output:
	// true
	// sha256:
}

func ExampleEncode() {
	enc, _ := fingerprint.Encode(map[string]any{"id": "o1", "qty": []any{1, 2.5}})
	fmt.Println(string(enc))

	_, err := fingerprint.Encode(map[string]any{"items": []any{map[string]any{"price": math.NaN()}}})
	var fe *fingerprint.Error
	if errors.As(err, &fe) {
		fmt.Println(fe.Path)
	}
	// Output:
	// m2{s2:ids2:o1s3:qtyl2[i1;f2.5;]}
	// $.items[0].price
}

func ExampleFormat() {
	enc, _ := fingerprint.Encode(map[string]any{"id": "o1", "qty": []any{1, 2.0}, "raw": []byte("hi")})
	text, _ := fingerprint.Format(enc)
	fmt.Println(text)
	// Output:
	// {
	//   "id": "o1",
	//   "qty": [
	//     1,
	//     2.0,
	//   ],
	//   "raw": bytes(6869),
	// }
}
