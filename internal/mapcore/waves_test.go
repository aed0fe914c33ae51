package mapcore

import (
	"slices"
	"testing"
)

// A batch's tasks go out in waves that each start at a trigger position
// (b = 10: triggers at 4, 14, 24, ...), so nothing after a trigger is sent
// before it, and nothing before it after it.
func TestInWavesSplitsAtTriggers(t *testing.T) {
	for _, tc := range []struct {
		b, from, n int
		want       [][2]int // positions [lo, hi)
	}{
		{10, 0, 10, [][2]int{{0, 4}, {4, 10}}},
		{10, 10, 10, [][2]int{{10, 14}, {14, 20}}},
		{10, 4, 10, [][2]int{{4, 14}}},
		{10, 0, 25, [][2]int{{0, 4}, {4, 14}, {14, 24}, {24, 25}}},
		{1, 0, 3, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		{10, 0, 1, [][2]int{{0, 1}}},
		{10, 0, 0, nil},
	} {
		var got [][2]int
		err := inWaves(tc.b, tc.from, tc.n, func(lo, hi int) error {
			got = append(got, [2]int{tc.from + lo, tc.from + hi})
			return nil
		})
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("inWaves(b=%d, from=%d, n=%d) = %v, %v; want %v", tc.b, tc.from, tc.n, got, err, tc.want)
		}
	}
}
