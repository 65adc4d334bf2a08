//go:build !race

package nfqueue

const raceEnabled = false

// raceState is empty without -race: payloads point into the frames (see race.go).
type raceState struct{}

func (*raceState) init()                             {}
func (*raceState) payload(_ uint32, b []byte) []byte { return b }
func (*raceState) decided(uint32)                    {}
func (*raceState) decidedThrough(uint32)             {}
