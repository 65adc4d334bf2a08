package nflog

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"zcio/go/internal/testnet"
)

// Every logged packet arrives with its payload, prefix, hook and consecutive sequence
// numbers; nothing is lost; cancellation stops the reader within 200 ms.
func TestEveryLoggedPacketArrivesWithItsAttributes(t *testing.T) {
	h := testnet.New(t, "nflog")
	h.Iptables("-A", "OUTPUT", "-o", "lo", "-p", "udp", "--dport", "9998", "-j", "NFLOG",
		"--nflog-group", "42", "--nflog-prefix", "go-test")
	nf, err := Open(&Config{NetNS: h.NetNS(), Group: 42, Copymode: CopyPacket})
	if err != nil {
		t.Fatal(err)
	}
	defer nf.Close()
	var mu sync.Mutex
	var keys []int
	var seqs []uint32
	ctx, cancel := context.WithCancel(context.Background())
	err = nf.RegisterWithErrorFunc(ctx, func(a Attribute) int {
		if a.Prefix == nil || *a.Prefix != "go-test" || a.Hook == nil || *a.Hook != 3 ||
			a.Payload == nil || len(*a.Payload) != 29 || a.Seq == nil {
			t.Errorf("attributes: prefix %v hook %v payload %v seq %v", a.Prefix, a.Hook, a.Payload, a.Seq)
			return 0
		}
		mu.Lock()
		keys = append(keys, int((*a.Payload)[28]))
		seqs = append(seqs, *a.Seq)
		mu.Unlock()
		return 0
	}, func(e error) int { t.Errorf("reader: %v", e); return 1 })
	if err != nil {
		t.Fatal(err)
	}
	h.UDP("127.0.0.1:9998") // a receiver: no ICMP error fails the sender's next write
	tx := h.Dial("127.0.0.1:9998")
	for i := 0; i < 100; i++ {
		tx.Write([]byte{byte(i)})
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(keys)
		mu.Unlock()
		if n == 100 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	cancel()
	<-nf.done
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("reader stopped %v after cancel", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 100 {
		t.Fatalf("%d of 100 logged packets arrived", len(keys))
	}
	for i := range keys {
		if keys[i] != i || seqs[i] != seqs[0]+uint32(i) {
			t.Fatalf("packet %d: key %d seq %d (first seq %d)", i, keys[i], seqs[i], seqs[0])
		}
	}
	if s := nf.Stats(); s.Packets != 100 || s.Lost != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Errors wrap the errno and zcio's reason.
func TestBindingABusyGroupFailsWithTheErrnoAndReason(t *testing.T) {
	h := testnet.New(t, "nflogerr")
	a, err := Open(&Config{NetNS: h.NetNS(), Group: 7, Copymode: CopyMeta})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = Open(&Config{NetNS: h.NetNS(), Group: 7, Copymode: CopyMeta})
	// The kernel answers EPERM for a group bound by another socket; the reason says so.
	if !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "another socket is bound") {
		t.Fatalf("second bind: %v, want EPERM with the reason", err)
	}
	t.Logf("%v", err)
	if _, err := Open(&Config{Group: 8, Flags: FlagGlobal}); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("FlagGlobal: %v", err)
	}
	if _, err := Open(&Config{Group: 8, Copymode: 9}); err != ErrCopyMode {
		t.Fatalf("copy mode 9: %v", err)
	}
}
