package mapstep_test

import (
	"context"
	"testing"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

type goldenIn struct {
	Doubled mapstep.Results[int]
	Raw     reactor.Args
	Each    []mapstep.Results[reactor.Args]
}

// A definition's fingerprint is what a stored run is matched against after
// a deploy: it must not change when goreactor's own packages move around.
// These values were computed by the release before the engine core moved
// to internal/ (reactor/ and mapstep/ held it then); a run stored by that
// release resumes under this one only if they still match.
func TestFingerprintsSurviveTheEngineMove(t *testing.T) {
	elem := reactor.MustDefine("golden-elem",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("double", reactor.StepConfig[struct{ Item int }, int]{
			Args: reactor.Bindings{"Item": reactor.FromInput("item")},
			Run:  func(ctx context.Context, in struct{ Item int }) (int, error) { return 2 * in.Item, nil },
		}),
		reactor.Returns(reactor.FromStep("double")))
	owner := reactor.MustDefine("golden-owner",
		reactor.Input[[]int]("items", reactor.Required()),
		reactor.Input[reactor.Args]("extra"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true}),
		reactor.Step("collect", reactor.StepConfig[goldenIn, reactor.Args]{
			Args: reactor.Bindings{"Doubled": reactor.FromStep("each"), "Raw": reactor.FromInput("extra")},
			Run:  func(ctx context.Context, in goldenIn) (reactor.Args, error) { return in.Raw, nil },
		}),
		reactor.Returns(reactor.FromStep("collect")))
	for _, tc := range []struct {
		def  *reactor.Definition
		want string
	}{{elem, "d018368f143e01cb"}, {owner, "8dcf84c038a95a97"}} {
		t.Logf("%s %s", tc.def.Name(), tc.def.Fingerprint())
		if got := tc.def.Fingerprint(); got != tc.want {
			t.Errorf("%s: fingerprint %s, want %s", tc.def.Name(), got, tc.want)
		}
	}
}
