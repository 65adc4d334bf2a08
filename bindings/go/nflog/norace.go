//go:build !race

package nflog

// raceState is empty without -race: payloads point into the frames (see race.go).
type raceState struct{}

func (*raceState) init()                   {}
func (*raceState) payload(b []byte) []byte { return b }
func (*raceState) done()                   {}
