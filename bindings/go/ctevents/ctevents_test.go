package ctevents

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"zcio/go/internal/testnet"
)

// NEW events of 10 UDP flows arrive with their tuples; nothing is lost; Close is prompt.
func TestNewFlowsArriveAsEventsWithTheirTuples(t *testing.T) {
	h := testnet.New(t, "ct")
	// Conntrack must be in use in the namespace for events to flow.
	h.Iptables("-A", "INPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT")
	c, err := Dial(&Config{NetNS: h.NetNS()})
	if err != nil {
		t.Fatal(err)
	}
	evs := make(chan Event, 1024)
	errs, err := c.Listen(evs, 1, []NetlinkGroup{GroupCTNew})
	if err != nil {
		t.Fatal(err)
	}
	h.UDP("127.0.0.1:7000")
	for i := 0; i < 10; i++ {
		tx := h.DialFrom(fmt.Sprintf("127.0.0.1:%d", 40000+i), "127.0.0.1:7000")
		tx.Write([]byte("x"))
	}
	seen := map[uint16]bool{}
	lo := netip.MustParseAddr("127.0.0.1")
	timeout := time.After(3 * time.Second)
	for len(seen) < 10 {
		select {
		case e := <-evs:
			o := e.Flow.TupleOrig
			if e.Type != EventNew || o.Proto.Protocol != 17 || o.IP.SourceAddress != lo ||
				o.Proto.DestinationPort != 7000 || e.Flow.TupleReply.Proto.SourcePort != 7000 {
				t.Fatalf("event %v %+v", e, e.Flow)
			}
			seen[o.Proto.SourcePort] = true
		case err := <-errs:
			t.Fatalf("reader: %v", err)
		case <-timeout:
			t.Fatalf("%d of 10 NEW events", len(seen))
		}
	}
	start := time.Now()
	c.Close()
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("Close took %v", d)
	}
	if s := c.Stats(); s.New != 10 || s.Lost != 0 {
		t.Fatalf("stats %+v", s)
	}
}
