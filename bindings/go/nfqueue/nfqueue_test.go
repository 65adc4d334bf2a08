package nfqueue

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"zcio/go/internal/testnet"
)

const port = 9999

// queueHost is a namespace whose OUTPUT UDP traffic to port 9999 on loopback goes to NFQUEUE
// queue q, with a receiver on 127.0.0.1:9999.
func queueHost(t *testing.T, q int, extra ...string) (*testnet.Host, *net.UDPConn) {
	h := testnet.New(t, "nfq")
	target := []string{"--queue-num", fmt.Sprint(q)}
	if len(extra) > 0 {
		target = extra
	}
	h.Iptables(append([]string{"-A", "OUTPUT", "-o", "lo", "-p", "udp", "--dport", fmt.Sprint(port),
		"-j", "NFQUEUE"}, target...)...)
	return h, h.UDP(fmt.Sprintf("127.0.0.1:%d", port))
}

func open(t *testing.T, h *testnet.Host, q uint16, mod func(*Config)) *Nfqueue {
	t.Helper()
	cfg := Config{NetNS: h.NetNS(), NfQueue: q, MaxPacketLen: 0xffff, Copymode: NfQnlCopyPacket}
	if mod != nil {
		mod(&cfg)
	}
	nf, err := Open(&cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { nf.Close() })
	return nf
}

// key is the first byte of a datagram's payload (after 20 + 8 bytes of IPv4 and UDP).
func key(p []byte) int {
	if len(p) < 29 {
		return -1
	}
	return int(p[28])
}

func send(t *testing.T, c *net.UDPConn, keys ...int) {
	t.Helper()
	for _, k := range keys {
		if _, err := c.Write([]byte{byte(k), 'z', 'c', 'i', 'o'}); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func arrivedKeys(got [][]byte) []int {
	var ks []int
	for _, g := range got {
		ks = append(ks, int(g[0]))
	}
	sort.Ints(ks)
	return ks
}

// statsEventually waits (up to a second) for the reader's counters to satisfy ok: it
// refreshes them after each receive, so they may trail what the test already saw arrive.
func statsEventually(nf *Nfqueue, ok func(Stats) bool) Stats {
	s := nf.Stats()
	for end := time.Now().Add(time.Second); !ok(s) && time.Now().Before(end); s = nf.Stats() {
		time.Sleep(time.Millisecond)
	}
	return s
}

func failOnError(t *testing.T) ErrorFunc {
	return func(e error) int {
		t.Errorf("reader error: %v", e)
		return 1
	}
}

// Accept, drop, mark, repeat and a rewritten payload, each checked where the kernel shows it:
// what arrives, the mark counted by an INPUT rule, a repeated packet queued again.
func TestVerdictsAcceptDropMarkRepeatAndRewriteReachTheKernel(t *testing.T) {
	h, rx := queueHost(t, 1)
	h.Iptables("-A", "INPUT", "-p", "udp", "--dport", fmt.Sprint(port), "-m", "mark", "--mark", "7")
	nf := open(t, h, 1, nil)
	tx := h.Dial(fmt.Sprintf("127.0.0.1:%d", port))
	var mu sync.Mutex
	seen := map[int]int{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := nf.RegisterWithErrorFunc(ctx, func(a Attribute) int {
		id, p := *a.PacketID, *a.Payload
		k := key(p)
		mu.Lock()
		seen[k]++
		again := seen[k] > 1
		mu.Unlock()
		switch k % 5 {
		case 0:
			nf.SetVerdict(id, NfAccept)
		case 1:
			nf.SetVerdict(id, NfDrop)
		case 2:
			nf.SetVerdictWithMark(id, NfAccept, 7)
		case 3:
			if again {
				nf.SetVerdict(id, NfAccept)
			} else {
				nf.SetVerdict(id, NfRepeat)
			}
		case 4:
			q := append([]byte(nil), p...)
			q[28] = byte(k + 100)
			if err := FixChecksums(q); err != nil {
				t.Errorf("FixChecksums: %v", err)
			}
			nf.SetVerdictModPacket(id, NfAccept, q)
		}
		return 0
	}, failOnError(t))
	if err != nil {
		t.Fatal(err)
	}
	send(t, tx, seq(50)...)
	got := arrivedKeys(testnet.Collect(rx, 40, 2*time.Second))
	var want []int
	for k := 0; k < 50; k++ {
		switch k % 5 {
		case 0, 2, 3:
			want = append(want, k)
		case 4:
			want = append(want, k+100)
		}
	}
	sort.Ints(want)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("arrived %v\nwant    %v", got, want)
	}
	if n := h.Counter("INPUT", "mark match 0x7"); n != 10 {
		t.Errorf("%d packets reached INPUT with mark 7, want 10", n)
	}
	mu.Lock()
	for k := 3; k < 50; k += 5 {
		if seen[k] != 2 {
			t.Errorf("repeated packet %d seen %d times, want 2 (queued again by NF_REPEAT)", k, seen[k])
		}
	}
	mu.Unlock()
	s := statsEventually(nf, func(s Stats) bool { return s.Dropped+s.Accepted == 60 })
	if s.Dropped != 10 || s.Repeated != 10 || s.Received != 60 {
		t.Errorf("stats %+v", s)
	}
}

// A callback that panics is recovered: its packet gets DefaultVerdict, the ErrorFunc gets a
// *PanicError, and the reader goes on.
func TestAPanickingCallbackGetsTheDefaultVerdictAndTheReaderGoesOn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		deflt  int
		arrive int
	}{{"accept", NfAccept, 20}, {"zero value drops", 0, 10}} {
		t.Run(tc.name, func(t *testing.T) {
			h, rx := queueHost(t, 2)
			nf := open(t, h, 2, func(c *Config) { c.DefaultVerdict = tc.deflt })
			tx := h.Dial(fmt.Sprintf("127.0.0.1:%d", port))
			var panics atomic.Int32
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			err := nf.RegisterWithErrorFunc(ctx, func(a Attribute) int {
				if key(*a.Payload)%2 == 1 {
					panic(fmt.Sprintf("odd packet %d", key(*a.Payload)))
				}
				nf.SetVerdict(*a.PacketID, NfAccept)
				return 0
			}, func(e error) int {
				var p *PanicError
				if !errors.As(e, &p) || !strings.Contains(fmt.Sprint(p.Value), "odd packet") {
					t.Errorf("error %v, want a *PanicError", e)
				}
				panics.Add(1)
				return 0
			})
			if err != nil {
				t.Fatal(err)
			}
			send(t, tx, seq(20)...)
			got := testnet.Collect(rx, tc.arrive, 500*time.Millisecond)
			if len(got) != tc.arrive || panics.Load() != 10 || nf.Stats().Panics != 10 {
				t.Fatalf("arrived %d (want %d), panics %d", len(got), tc.arrive, panics.Load())
			}
		})
	}
}

// Cancelling the context stops the reader within 200 ms, idle and under a flood; the queue
// is unbound (later packets are dropped by the kernel: nobody listens).
func TestCancellationStopsTheReaderWithin200ms(t *testing.T) {
	for _, flood := range []bool{false, true} {
		t.Run(fmt.Sprintf("flood=%v", flood), func(t *testing.T) {
			h, rx := queueHost(t, 3)
			nf := open(t, h, 3, nil)
			tx := h.Dial(fmt.Sprintf("127.0.0.1:%d", port))
			ctx, cancel := context.WithCancel(context.Background())
			var n atomic.Int64
			if err := nf.RegisterWithErrorFunc(ctx, func(a Attribute) int {
				n.Add(1)
				nf.SetVerdict(*a.PacketID, NfAccept)
				return 0
			}, failOnError(t)); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if flood {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
							tx.Write([]byte{1})
						}
					}
				}()
				for n.Load() < 1000 {
					time.Sleep(time.Millisecond)
				}
			} else {
				time.Sleep(50 * time.Millisecond)
			}
			start := time.Now()
			cancel()
			<-nf.done
			took := time.Since(start)
			close(stop)
			wg.Wait()
			if took > 200*time.Millisecond {
				t.Fatalf("reader stopped %v after cancel, want < 200ms", took)
			}
			t.Logf("stopped %v after cancel (%d packets handled)", took, n.Load())
			testnet.Collect(rx, 1<<30, 100*time.Millisecond)
			send(t, tx, 5)
			if got := testnet.Collect(rx, 1, 300*time.Millisecond); len(got) != 0 {
				t.Fatalf("a packet passed the unbound queue")
			}
		})
	}
}

// Four queues behind one rule (--queue-balance), one Nfqueue and reader goroutine each:
// every packet is seen exactly once and arrives.
func TestFanOutOverQueuesWithOneGoroutineEach(t *testing.T) {
	h, rx := queueHost(t, 0, "--queue-balance", "20:23")
	var mu sync.Mutex
	seen := map[uint16]int{}
	total := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for q := uint16(20); q <= 23; q++ {
		nf := open(t, h, q, nil)
		q := q
		if err := nf.RegisterWithErrorFunc(ctx, func(a Attribute) int {
			mu.Lock()
			seen[q]++
			total++
			mu.Unlock()
			nf.SetVerdict(*a.PacketID, NfAccept)
			return 0
		}, failOnError(t)); err != nil {
			t.Fatal(err)
		}
	}
	const flows, per = 32, 10
	// Read while sending: 320 datagrams would overflow the receiver's buffer.
	gotc := make(chan [][]byte)
	go func() { gotc <- testnet.Collect(rx, flows*per, time.Second) }()
	for f := 0; f < flows; f++ {
		// The balance hashes addresses (not ports): a source address per flow.
		tx := h.DialFrom(fmt.Sprintf("127.0.0.%d:0", f+2), fmt.Sprintf("127.0.0.1:%d", port))
		send(t, tx, seq(per)...)
	}
	got := <-gotc
	mu.Lock()
	defer mu.Unlock()
	if len(got) != flows*per || total != flows*per || len(seen) < 2 {
		t.Fatalf("arrived %d, seen %d over queues %v; want %d over several queues", len(got), total, seen, flows*per)
	}
	t.Logf("per queue: %v", seen)
}

// The batch API: per-packet verdicts, a batch-wide accept, a packet held past its batch and
// decided from another goroutine (its payload still readable until then).
func TestBatchesWithHeldPacketsAndBatchVerdicts(t *testing.T) {
	h, rx := queueHost(t, 4)
	nf := open(t, h, 4, nil)
	tx := h.Dial(fmt.Sprintf("127.0.0.1:%d", port))
	type heldPkt struct {
		id      uint32
		payload []byte
	}
	heldc := make(chan heldPkt, 1)
	var batches atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Queued before reading starts, so receives hand over whole batches (up to 64).
	send(t, tx, seq(100)...)
	err := nf.RegisterBatch(ctx, func(b *Batch) int {
		batches.Add(1)
		for i := range b.Packets {
			p := &b.Packets[i]
			switch k := key(p.Payload); {
			case k == 10:
				p.Hold()
				heldc <- heldPkt{p.ID, p.Payload}
			case k%2 == 1:
				p.Drop()
			}
		}
		b.Accept()
		return 0
	}, failOnError(t))
	if err != nil {
		t.Fatal(err)
	}
	hp := <-heldc
	got := testnet.Collect(rx, 49, time.Second)
	if len(got) != 49 {
		t.Fatalf("arrived %d before the held packet's verdict, want 49", len(got))
	}
	if key(hp.payload) != 10 {
		t.Fatalf("held payload changed: %v", hp.payload)
	}
	start := time.Now()
	if err := nf.SetVerdict(hp.id, NfAccept); err != nil {
		t.Fatal(err)
	}
	late := testnet.Collect(rx, 1, time.Second)
	if len(late) != 1 || late[0][0] != 10 {
		t.Fatalf("held packet did not arrive after its verdict: %v", late)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("held packet arrived %v after its verdict from another goroutine", d)
	}
	s := statsEventually(nf, func(s Stats) bool { return s.Held == 0 })
	if s.Batches == 0 || s.Dropped != 50 || s.Accepted != 50 || s.Held != 0 {
		t.Errorf("stats %+v: want VERDICT_BATCH messages, 50 drops, 50 accepts", s)
	}
	t.Logf("%d batches, stats %+v", batches.Load(), s)
}

// go-nfqueue programs often hand packets to worker goroutines that decide later: the reader
// wakes for each such verdict at once, the payload is readable until it, and the kernel sees
// verdicts in the order given (packets reordered by deciding out of order).
func TestVerdictsFromOtherGoroutinesWakeTheReaderAndKeepTheirOrder(t *testing.T) {
	h, rx := queueHost(t, 5)
	nf := open(t, h, 5, nil)
	tx := h.Dial(fmt.Sprintf("127.0.0.1:%d", port))
	type job struct {
		id      uint32
		payload []byte
	}
	jobs := make(chan job, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := nf.RegisterWithErrorFunc(ctx, func(a Attribute) int {
		jobs <- job{*a.PacketID, *a.Payload}
		return 0
	}, failOnError(t)); err != nil {
		t.Fatal(err)
	}
	send(t, tx, 1, 2, 3)
	var js []job
	for len(js) < 3 {
		js = append(js, <-jobs)
	}
	for _, j := range js {
		if key(j.payload) < 1 || key(j.payload) > 3 {
			t.Fatalf("payload %v", j.payload)
		}
	}
	// Decide 3, then 2, then 1, from this goroutine: they arrive in that order.
	for i := 2; i >= 0; i-- {
		start := time.Now()
		if err := nf.SetVerdict(js[i].id, NfAccept); err != nil {
			t.Fatal(err)
		}
		got := testnet.Collect(rx, 1, time.Second)
		if len(got) != 1 || int(got[0][0]) != i+1 {
			t.Fatalf("after deciding %d got %v", i+1, got)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("verdict took %v to reach the kernel", d)
		}
	}
}

// Errors wrap the errno (errors.Is) and say zcio's reason.
func TestErrorsWrapTheErrnoAndZciosReason(t *testing.T) {
	h := testnet.New(t, "err")
	open(t, h, 30, nil)
	_, err := Open(&Config{NetNS: h.NetNS(), NfQueue: 30, Copymode: NfQnlCopyPacket})
	if !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "queue 30") {
		t.Fatalf("second bind of queue 30: %v; want EPERM with the queue named", err)
	}
	t.Logf("second bind: %v", err)
	_, err = Open(&Config{NetNS: h.NetNS(), NfQueue: 31, Flags: NfQaCfgFlagSecCx})
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "unsupported queue flags") {
		t.Fatalf("SecCx flag: %v", err)
	}
	if _, err := Open(&Config{NfQueue: 31, Flags: 1 << 10}); err != ErrInvFlag {
		t.Fatalf("unknown flag: %v, want ErrInvFlag (as go-nfqueue)", err)
	}
	nf := open(t, h, 32, nil)
	if err := nf.SetVerdict(1, 77); err != ErrInvalidVerdict {
		t.Fatalf("verdict 77: %v, want ErrInvalidVerdict", err)
	}
	nf.Close()
	if err := nf.SetVerdict(1, NfAccept); err == nil {
		t.Fatal("a verdict after Close was taken")
	}
}
