//go:build race

package nfqueue

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"zcio/go/internal/testnet"
)

// Under -race a payload read after its packet's verdict, from another goroutine, is reported
// by the race detector (the reader overwrites the payload when it applies the verdict).
func TestAPayloadReadAfterItsVerdictIsReportedByTheRaceDetector(t *testing.T) {
	testnet.Require(t, testnet.Problem())
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperReadAfterVerdict$", "-test.v")
	cmd.Env = append(os.Environ(), "ZCIO_GO_RACE_HELPER=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("WARNING: DATA RACE")) ||
		!bytes.Contains(out, []byte("nfqueue.scribble")) {
		t.Fatalf("want the race detector to report the read after the verdict (err %v):\n%s", err, out)
	}
	t.Logf("the race detector reported it:\n%s", firstLines(string(out), 12))
}

func firstLines(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[:n]
	}
	return strings.Join(l, "\n")
}

// The misuse the test above runs in a child process: the payload goes to a worker goroutine,
// the callback decides the packet at once, the worker reads the payload afterwards.
func TestHelperReadAfterVerdict(t *testing.T) {
	if os.Getenv("ZCIO_GO_RACE_HELPER") != "1" {
		t.Skip("helper of TestAPayloadReadAfterItsVerdictIsReportedByTheRaceDetector")
	}
	h, _ := queueHost(t, 6)
	nf := open(t, h, 6, nil)
	tx := h.Dial(fmt.Sprintf("127.0.0.1:%d", port))
	payloads := make(chan []byte, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nf.RegisterWithErrorFunc(ctx, func(a Attribute) int {
		payloads <- *a.Payload
		nf.SetVerdict(*a.PacketID, NfAccept)
		return 0
	}, func(error) int { return 0 })
	send(t, tx, 1)
	p := <-payloads
	time.Sleep(200 * time.Millisecond) // the verdict has been applied by now
	fmt.Println("read after the verdict:", p[28])
}

// Under -race the bytes read after the verdict are garbage even on the reader goroutine, so
// a test run shows a use after the verdict that the detector cannot see.
func TestAPayloadKeptPastItsVerdictReadsGarbageUnderRace(t *testing.T) {
	h, _ := queueHost(t, 7)
	nf := open(t, h, 7, nil)
	tx := h.Dial(fmt.Sprintf("127.0.0.1:%d", port))
	var kept []byte
	res := make(chan []byte, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nf.RegisterBatch(ctx, func(b *Batch) int {
		if kept != nil {
			res <- append([]byte(nil), kept...)
			kept = nil
		} else {
			kept = b.Packets[0].Payload
		}
		b.Accept()
		return 0
	}, failOnError(t))
	send(t, tx, 1)
	time.Sleep(50 * time.Millisecond)
	send(t, tx, 2)
	got := <-res
	if !bytes.Equal(got, bytes.Repeat([]byte{poison}, len(got))) {
		t.Fatalf("payload after its verdict reads %v, want poison", got)
	}
}
