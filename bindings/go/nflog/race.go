//go:build race

package nflog

// Built with -race: payloads are copies overwritten when the callback returns, so a use
// after it is reported by the race detector (from another goroutine) or reads garbage.

type raceState struct{ cur []byte }

func (r *raceState) init() {}

func (r *raceState) payload(b []byte) []byte {
	r.cur = append([]byte(nil), b...)
	return r.cur
}

func (r *raceState) done() {
	for i := range r.cur {
		r.cur[i] = 0xdb
	}
	r.cur = nil
}
