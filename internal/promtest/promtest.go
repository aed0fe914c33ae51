// Package promtest scrapes a /metrics endpoint over HTTP for goreactor's
// tests and reads values from the parsed exposition.
package promtest

import (
	"fmt"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs url and parses the Prometheus text exposition.
func Scrape(t testing.TB, url string) Families {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// Value is the value of the series of family name whose labels include
// every pair in labels ("k", "v", ...), summed over the matching series
// (a histogram contributes its sample count). It is 0 when none matches,
// and -1 when the family is absent.
func (f Families) Value(name string, labels ...string) float64 {
	fam, ok := f[name]
	if !ok {
		return -1
	}
	if len(labels)%2 != 0 {
		panic(fmt.Sprintf("promtest: odd labels %q", labels))
	}
	var sum float64
next:
	for _, m := range fam.GetMetric() {
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}
