//go:build race

package nfqueue

// Built with -race: payloads are copies the reader overwrites when the packet's verdict is
// applied, so a read after the verdict is a data race the detector reports (from another
// goroutine) and shows garbage bytes (on any goroutine). See the package comment.

const raceEnabled = true

// poison is what a payload reads after its verdict under -race.
const poison = 0xdb

type raceState struct {
	bufs map[uint32][]byte
}

func (r *raceState) init() { r.bufs = make(map[uint32][]byte) }

// payload returns the copy handed out for packet id.
func (r *raceState) payload(id uint32, b []byte) []byte {
	c := make([]byte, len(b))
	copy(c, b)
	r.bufs[id] = c
	return c
}

func scribble(b []byte) {
	for i := range b {
		b[i] = poison
	}
}

// decided overwrites packet id's payload copy: its verdict is applied.
func (r *raceState) decided(id uint32) {
	if b, ok := r.bufs[id]; ok {
		scribble(b)
		delete(r.bufs, id)
	}
}

// decidedThrough is decided for every packet up to id (SetVerdictBatch).
func (r *raceState) decidedThrough(id uint32) {
	for k, b := range r.bufs {
		if int32(id-k) >= 0 {
			scribble(b)
			delete(r.bufs, k)
		}
	}
}
