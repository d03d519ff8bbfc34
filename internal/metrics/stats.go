package metrics

import (
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Histogram is a histogram's count and sum, as Stats gives it.
type Histogram struct {
	Count uint64  `json:"count"`
	Sum   float64 `json:"sum"`
}

// Stats is the bgtask_ metrics as JSON data, the same values a scrape reads, for
// the NATS micro service's stats. Each is under its name: a metric without labels
// is its value (a histogram its count and sum); one with labels is an object
// of its values by their labels, "name=value" joined by commas.
func (m *Metrics) Stats() map[string]any {
	families, err := m.reg.Gather()
	out := map[string]any{}
	if err != nil {
		out["error"] = err.Error()
	}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "bgtask_") {
			continue
		}
		byLabels := map[string]any{}
		for _, metric := range f.GetMetric() {
			byLabels[labelKey(metric.GetLabel())] = value(metric)
		}
		if v, ok := byLabels[""]; ok && len(byLabels) == 1 {
			out[f.GetName()] = v
		} else {
			out[f.GetName()] = byLabels
		}
	}
	return out
}

func labelKey(labels []*dto.LabelPair) string {
	pairs := make([]string, len(labels))
	for i, l := range labels {
		pairs[i] = l.GetName() + "=" + l.GetValue()
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}

func value(m *dto.Metric) any {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return Histogram{Count: m.Histogram.GetSampleCount(), Sum: m.Histogram.GetSampleSum()}
	}
	return nil
}
