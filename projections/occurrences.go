package projections

import (
	"cmp"
	"slices"

	"github.com/bgtask/bgtask/engine"
)

// Occurrences returns the tasks a schedule registered (their spec's
// occurrence names it), newest slot first, at most limit (0: all). A settled
// task is given by its summary, which keeps the occurrence.
func (p *Projector) Occurrences(schedule string, limit int) []engine.State {
	var out []engine.State
	p.mu.RLock()
	for _, s := range p.tasks {
		if o := s.Spec.Occurrence; o != nil && o.Schedule == schedule {
			out = append(out, *s)
		}
	}
	for _, sum := range p.summaries {
		if o := sum.Occurrence; o != nil && o.Schedule == schedule {
			out = append(out, sum.state())
		}
	}
	p.mu.RUnlock()
	slices.SortFunc(out, func(a, b engine.State) int {
		if c := b.Spec.Occurrence.Slot.Compare(a.Spec.Occurrence.Slot); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}
